package tun

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrURingOff is URingErr's answer when Config.NoURing turned io_uring off.
var ErrURingOff = errors.New("tun: io_uring turned off (NoURing)")

// Write writes the packets bufs[i][offset:], coalescing TCP segments (and
// UDP datagrams, with USO) of a flow into super-packets (coalesce.go). It
// may modify the offset bytes in front of each packet and the headers of
// the first packet of each super-packet. offset must be at least
// MinWriteOffset. The error joins the failures of individual packets.
//
// When the call comes to two or more writes (packets and super-packets)
// and the kernel has io_uring, they are submitted together with one
// io_uring_enter (writeURing); else each is one writev(2). Either way
// Write returns once the kernel has taken or refused every packet.
//
// Writes from several goroutines (the shards) never wait for each other:
// each takes its own scratch (the write plan and vectors) from a pool and
// writes the shared descriptor directly (writer.writev). The one ring goes
// to a Write that finds it free; a Write that finds it taken uses writev.
func (d *Device) Write(bufs [][]byte, offset int) error {
	if offset < MinWriteOffset {
		return fmt.Errorf("tun: write offset %d below %d", offset, MinWriteOffset)
	}
	if !d.vnet {
		_, err := d.dev.Write(bufs, offset)
		return d.closedErr(err)
	}
	w := writers.Get().(*writer)
	w.d = d
	err := w.write(bufs, offset)
	w.d = nil
	writers.Put(w)
	return err
}

// writer is the scratch state of one Write.
type writer struct {
	d       *Device
	co      coalescer
	iovs    []unix.Iovec
	iov1    [1]unix.Iovec
	wiov    []unix.Iovec   // what writev writes: iovs or iov1, or a part
	saved   [savedLen]byte // the head of a super-packet, to undo
	werr    error
	tried   bool // tryFn had an answer other than EAGAIN
	writeFn func(uintptr) bool
	tryFn   func(uintptr)

	// io_uring (writeURing), while the writer holds the Device's ring
	ring     *ring
	ops      []writeOp
	res      []int32          // each op's result, from its completion
	heads    [][savedLen]byte // the heads of the ops' super-packets, to undo
	enterErr error            // io_uring_enter's failure, in submitURing
	uringFn  func(uintptr)
}

var writers = sync.Pool{New: func() any { return newWriter() }}

func newWriter() *writer {
	w := &writer{iovs: make([]unix.Iovec, 0, 256)}
	w.writeFn = w.writevFd
	w.tryFn = func(fd uintptr) { w.tried = w.writevFd(fd) }
	w.uringFn = w.submitURing
	return w
}

func (w *writer) write(bufs [][]byte, offset int) error {
	d := w.d
	c := &w.co
	c.udp = d.uso
	c.plan(bufs, offset)
	// ringErr nil: the ring is there (read without wmu, as a hint).
	if d.ringErr.Load() == nil && c.writes(2) >= 2 && d.wmu.TryLock() {
		if w.ring = d.ring; w.ring != nil {
			err := w.writeURing(bufs, offset)
			w.ring = nil
			d.wmu.Unlock()
			return err
		}
		d.wmu.Unlock()
	}
	var errs []error
	for i := range bufs {
		m := c.member[i]
		if m >= 0 && c.groups[m].first != i {
			continue // written with its group
		}
		var err error
		if m < 0 || c.groups[m].count == 1 {
			err = w.writeOne(bufs[i][offset-vnetHdrLen:])
		} else {
			err = w.writeGroup(bufs, offset, &c.groups[m])
		}
		if err != nil {
			if err == os.ErrClosed {
				return err
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// writeOne writes one packet, b being its virtio header room and the
// packet.
func (w *writer) writeOne(b []byte) error {
	clear(b[:vnetHdrLen])
	setIov(&w.iov1[0], b)
	w.wiov = w.iov1[:]
	w.d.stats.writePackets.Add(1)
	return w.writev()
}

// writeGroup writes g as one super-packet; if the kernel refuses it, it
// restores the first packet and writes the packets one by one.
func (w *writer) writeGroup(bufs [][]byte, offset int, g *group) error {
	b := bufs[g.first][offset-vnetHdrLen:]
	copy(w.saved[:], b[:vnetHdrLen+g.hl])
	superHeader(b, g)
	w.iovs = w.groupIovs(w.iovs[:0], bufs, offset, g)
	w.wiov = w.iovs
	err := w.writev()
	if err == nil {
		w.d.stats.writePackets.Add(uint64(g.count))
		w.d.stats.superWrites.Add(1)
		return nil
	}
	if err == os.ErrClosed {
		return err
	}
	return w.ungroup(bufs, offset, g, w.saved[:])
}

// groupIovs appends to iovs the vectors of g's super-packet: the first
// packet, with the super-packet's headers, and the payloads of the others.
func (w *writer) groupIovs(iovs []unix.Iovec, bufs [][]byte, offset int, g *group) []unix.Iovec {
	iovs = append(iovs, unix.Iovec{})
	setIov(&iovs[len(iovs)-1], bufs[g.first][offset-vnetHdrLen:])
	for j := w.co.next[g.first]; j >= 0; j = w.co.next[j] {
		iovs = append(iovs, unix.Iovec{})
		setIov(&iovs[len(iovs)-1], bufs[j][offset+g.hl:])
	}
	return iovs
}

// ungroup restores the first packet of g, whose super-packet the kernel
// refused, from saved, and writes g's packets one by one.
func (w *writer) ungroup(bufs [][]byte, offset int, g *group, saved []byte) error {
	b := bufs[g.first][offset-vnetHdrLen:]
	copy(b[:vnetHdrLen+g.hl], saved)
	var errs []error
	for j := g.first; j >= 0; j = w.co.next[j] {
		if err := w.writeOne(bufs[j][offset-vnetHdrLen:]); err != nil {
			if err == os.ErrClosed {
				return err
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// writev writes w.wiov as one packet. It calls writev(2) on the
// descriptor directly, outside the descriptor's write lock, which the
// runtime would hold for one writer at a time; only if the kernel answers
// EAGAIN (which a TUN does not) does it wait in the poller.
func (w *writer) writev() error {
	d := w.d
	w.tried = false
	err := d.rc.Control(w.tryFn)
	if err == nil && !w.tried {
		err = d.rc.Write(w.writeFn)
	}
	if err != nil {
		return d.closedErr(err)
	}
	d.stats.writes.Add(1)
	return d.closedErr(w.werr)
}

func (w *writer) writevFd(fd uintptr) bool {
	// Raw: non-blocking, see rawRead.
	_, _, e := unix.RawSyscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&w.wiov[0])), uintptr(len(w.wiov)))
	if e == unix.EAGAIN || e == unix.EINTR {
		return false
	}
	w.werr = nil
	if e != 0 {
		w.werr = e
	}
	return true
}

// savedLen is room for the head of a super-packet: virtio header, IP
// header (no options or extension headers) and TCP header (with options).
const savedLen = vnetHdrLen + 60 + 60

// writeOp is one write of a Write through io_uring: a packet, or the
// super-packet of a group.
type writeOp struct {
	pkt  int // index in bufs of the (first) packet
	grp  int // index in the coalescer's groups, or -1: a packet alone
	head int // with grp: index in Device.heads of its saved head
	iov  int // its vectors: writer.iovs[iov : iov+niov]
	niov int
}

// writeURing writes the packets and super-packets of a Write as
// IORING_OP_WRITEV submissions, ringEntries per io_uring_enter, and waits
// for their completions; each completion's result counts and fails as
// the writev it replaces would (Write's other path). A submission the
// kernel did not take, or that completed with EAGAIN (which a TUN does
// not answer: its send buffer is unlimited), is written with writev(2)
// after the others. A super-packet the kernel refused is
// written again as its packets, one by one with writev(2), as writeGroup
// does. The writer holds the Device's ring (w.ring, under Device.wmu).
func (w *writer) writeURing(bufs [][]byte, offset int) error {
	d, c := w.d, &w.co
	if cap(w.iovs) < len(bufs) {
		w.iovs = make([]unix.Iovec, 0, len(bufs))
	}
	w.iovs, w.ops = w.iovs[:0], w.ops[:0]
	nheads := 0
	for i := range bufs {
		m := c.member[i]
		if m >= 0 && c.groups[m].first != i {
			continue // written with its group
		}
		op := writeOp{pkt: i, grp: -1, iov: len(w.iovs)}
		b := bufs[i][offset-vnetHdrLen:]
		if m < 0 || c.groups[m].count == 1 {
			clear(b[:vnetHdrLen])
			w.iovs = append(w.iovs, unix.Iovec{})
			setIov(&w.iovs[op.iov], b)
		} else {
			g := &c.groups[m]
			if nheads == len(w.heads) {
				w.heads = append(w.heads, [savedLen]byte{})
			}
			op.grp, op.head = m, nheads
			nheads++
			copy(w.heads[op.head][:], b[:vnetHdrLen+g.hl])
			superHeader(b, g)
			w.iovs = w.groupIovs(w.iovs, bufs, offset, g)
		}
		op.niov = len(w.iovs) - op.iov
		w.ops = append(w.ops, op)
	}
	if cap(w.res) < len(w.ops) {
		w.res = make([]int32, len(w.ops))
	}
	w.res = w.res[:len(w.ops)]
	// Inside the RawConn's Control, which holds a reference to the
	// descriptor, so that Close cannot release its number to another file
	// while the kernel writes: submitURing returns only when every
	// submission has completed.
	w.enterErr = nil
	if err := d.rc.Control(w.uringFn); err != nil {
		return d.closedErr(err)
	}
	if w.enterErr != nil {
		// io_uring_enter refused (a seccomp filter that allows
		// io_uring_setup only, say): writev(2) from now on.
		d.dropRing(w.enterErr)
	}
	var errs []error
	for k := range w.ops {
		op := &w.ops[k]
		var err error
		switch r := w.res[k]; {
		case r == resPending || r == -int32(unix.EAGAIN) || r == -int32(unix.EINTR):
			w.wiov = w.iovs[op.iov : op.iov+op.niov]
			err = w.writev()
		case r < 0:
			d.stats.writes.Add(1)
			err = d.closedErr(unix.Errno(-r))
		default:
			d.stats.writes.Add(1)
		}
		if op.grp < 0 {
			d.stats.writePackets.Add(1)
		} else if g := &c.groups[op.grp]; err == nil {
			d.stats.writePackets.Add(uint64(g.count))
			d.stats.superWrites.Add(1)
		} else if err != os.ErrClosed {
			err = w.ungroup(bufs, offset, g, w.heads[op.head][:vnetHdrLen+g.hl])
		}
		if err != nil {
			if err == os.ErrClosed {
				return err
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// submitURing queues w.ops on the ring and submits them, in runs of the
// ring's entries, each run waiting for its completions.
func (w *writer) submitURing(fd uintptr) {
	r := w.ring
	for k := 0; k < len(w.ops); {
		end := min(k+r.entries(), len(w.ops))
		for ; k < end; k++ {
			op := &w.ops[k]
			r.queueWritev(int(fd), &w.iovs[op.iov], op.niov, k)
		}
		enters, err := r.submit(w.res)
		w.d.stats.uringEnters.Add(uint64(enters))
		if err != nil {
			w.enterErr = err
			for ; k < len(w.ops); k++ {
				w.res[k] = resPending
			}
		}
	}
}

// initURing sets up the ring through which Write submits its writes,
// unless off or the device is written through the driver. Where the
// kernel refuses io_uring, Write uses writev(2), and URingErr says why.
func (d *Device) initURing(off bool) {
	switch {
	case off:
		d.setRingErr(ErrURingOff)
	case !d.vnet:
		d.setRingErr(errors.New("tun: no IFF_VNET_HDR, the driver writes"))
	default:
		r, err := ringSetup(ringEntries)
		if err != nil {
			d.setRingErr(fmt.Errorf("tun: %w", err))
			return
		}
		d.ring = r
	}
}

// dropRing closes the ring, with err the reason. Under wmu.
func (d *Device) dropRing(err error) {
	if d.ring != nil {
		d.ring.close()
		d.ring = nil
	}
	d.setRingErr(err)
}

func (d *Device) setRingErr(err error) { d.ringErr.Store(&err) }

// URingErr returns nil when Write submits its writes through io_uring,
// and otherwise why it writes with writev(2) (ErrURingOff, io_uring_setup
// refused: ENOSYS without io_uring, EPERM from a seccomp filter or
// kernel.io_uring_disabled), for the daemon to log. After Close it
// returns os.ErrClosed.
func (d *Device) URingErr() error {
	if p := d.ringErr.Load(); p != nil {
		return *p
	}
	return nil
}
