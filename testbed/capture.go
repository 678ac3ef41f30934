package testbed

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

var ne = binary.NativeEndian

// CaptureOptions tune Node.StartCapture.
type CaptureOptions struct {
	// Snaplen is how many bytes of each frame are kept; 0 keeps all of
	// it. Classification always sees the whole frame.
	Snaplen int
	// MaxFrames bounds the frames kept (later ones are counted in
	// Capture.Overflow, not kept); 0 means 1<<20.
	MaxFrames int
	// RecvBuffer is the socket's receive buffer; 0 means 64 MiB.
	RecvBuffer int
	// AcrossLinkDown keeps the capture going while the interface is down
	// (ENETDOWN, also when it starts down): the socket stays bound to it
	// and records again once it is up. The interface must not be deleted.
	AcrossLinkDown bool
}

// Capture records the frames that cross one interface of a namespace, in
// both directions, with an AF_PACKET socket.
type Capture struct {
	Ifname string
	fd     int
	opts   CaptureOptions
	stop   atomic.Bool
	done   chan struct{}

	mu       sync.Mutex
	frames   []Frame
	overflow int
	err      error
}

// CaptureResult is what a capture recorded.
type CaptureResult struct {
	// Frames in order of capture, classified.
	Frames []Frame
	// Drops is how many frames the kernel could not queue to the capture
	// socket (PACKET_STATISTICS); Overflow how many arrived beyond
	// MaxFrames. Either makes the capture incomplete.
	Drops    uint32
	Overflow int
}

// StartCapture starts recording every frame of interface ifname in the
// namespace. Stop ends it.
func (n *Node) StartCapture(ifname string, o CaptureOptions) (*Capture, error) {
	if o.MaxFrames <= 0 {
		o.MaxFrames = 1 << 20
	}
	if o.RecvBuffer <= 0 {
		o.RecvBuffer = 64 << 20
	}
	c := &Capture{Ifname: ifname, fd: -1, opts: o, done: make(chan struct{})}
	err := n.Do(func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		// Protocol 0 receives nothing until the bind below.
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("AF_PACKET socket: %w", err)
		}
		c.fd = fd
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, o.RecvBuffer); err != nil {
			return fmt.Errorf("SO_RCVBUFFORCE: %w", err)
		}
		tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return fmt.Errorf("SO_RCVTIMEO: %w", err)
		}
		// The kernel's time of each frame, not the reader's.
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
			return fmt.Errorf("SO_TIMESTAMPNS: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			return fmt.Errorf("bind to %s: %w", ifname, err)
		}
		// Reset the statistics (reading them clears them).
		_, err = unix.GetsockoptTpacketStats(fd, unix.SOL_PACKET, unix.PACKET_STATISTICS)
		return err
	})
	if err != nil {
		if c.fd >= 0 {
			unix.Close(c.fd)
		}
		return nil, fmt.Errorf("testbed: capture on %s in %s: %w", ifname, n.Name, err)
	}
	go c.loop()
	return c, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func (c *Capture) loop() {
	defer close(c.done)
	buf := make([]byte, 1<<16)
	oob := make([]byte, unix.CmsgSpace(int(unsafe.Sizeof(unix.Timespec{}))))
	for {
		// After Stop, drain what the socket holds without waiting.
		stopping := c.stop.Load()
		flags := unix.MSG_TRUNC
		if stopping {
			flags |= unix.MSG_DONTWAIT
		}
		k, oobn, _, from, err := unix.Recvmsg(c.fd, buf, oob, flags)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) || (c.opts.AcrossLinkDown && errors.Is(err, unix.ENETDOWN)) {
				if stopping {
					return
				}
				continue
			}
			c.mu.Lock()
			c.err = err
			c.mu.Unlock()
			return
		}
		now := frameTime(oob[:oobn])
		ll, _ := from.(*unix.SockaddrLinklayer)
		got := min(k, len(buf))
		f := Frame{Time: now, Len: k}
		if ll != nil {
			f.EtherType = htons(ll.Protocol)
			f.Outgoing = ll.Pkttype == unix.PACKET_OUTGOING
		}
		f.parse(buf[:got])
		keep := got
		if c.opts.Snaplen > 0 {
			keep = min(keep, c.opts.Snaplen)
		}
		f.Data = append([]byte(nil), buf[:keep]...)
		c.mu.Lock()
		if len(c.frames) < c.opts.MaxFrames {
			c.frames = append(c.frames, f)
		} else {
			c.overflow++
		}
		c.mu.Unlock()
	}
}

// frameTime is the kernel's time stamp of a frame (SCM_TIMESTAMPNS in
// oob), or now if there is none.
func frameTime(oob []byte) time.Time {
	msgs, _ := unix.ParseSocketControlMessage(oob)
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= int(unsafe.Sizeof(unix.Timespec{})) {
			ts := *(*unix.Timespec)(unsafe.Pointer(&m.Data[0]))
			return time.Unix(ts.Unix())
		}
	}
	return time.Now()
}

// Frames returns a copy of the frames recorded so far, classified.
func (c *Capture) Frames() []Frame {
	c.mu.Lock()
	fr := append([]Frame(nil), c.frames...)
	c.mu.Unlock()
	classifyFragments(fr)
	return fr
}

// Stop ends the capture, after reading what the socket still holds, and
// returns what it recorded. It returns an error if reading from the socket
// failed.
func (c *Capture) Stop() (*CaptureResult, error) {
	if c.stop.Swap(true) {
		return nil, errors.New("testbed: capture already stopped")
	}
	<-c.done
	st, serr := unix.GetsockoptTpacketStats(c.fd, unix.SOL_PACKET, unix.PACKET_STATISTICS)
	unix.Close(c.fd)
	c.mu.Lock()
	defer c.mu.Unlock()
	res := &CaptureResult{Frames: c.frames, Overflow: c.overflow}
	if serr == nil {
		res.Drops = st.Drops
	}
	classifyFragments(res.Frames)
	if c.err != nil {
		return res, fmt.Errorf("testbed: capture on %s: %w", c.Ifname, c.err)
	}
	if serr != nil {
		return res, fmt.Errorf("testbed: capture statistics: %w", serr)
	}
	return res, nil
}

// Counts returns how many frames fall in each class.
func (r *CaptureResult) Counts() map[Class]int {
	m := make(map[Class]int)
	for i := range r.Frames {
		m[r.Frames[i].Class]++
	}
	return m
}

// Complete reports whether every frame was recorded.
func (r *CaptureResult) Complete() bool { return r.Drops == 0 && r.Overflow == 0 }

// Summary describes the counts per class.
func (r *CaptureResult) Summary() string {
	m := r.Counts()
	s := fmt.Sprintf("%d frames", len(r.Frames))
	for cl := Class(0); cl < numClasses; cl++ {
		if m[cl] > 0 {
			s += fmt.Sprintf(", %s %d", cl, m[cl])
		}
	}
	if r.Drops > 0 || r.Overflow > 0 {
		s += fmt.Sprintf(" (incomplete: %d dropped by the kernel, %d over the limit)", r.Drops, r.Overflow)
	}
	return s
}
