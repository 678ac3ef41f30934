package load

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/espd/espd/testbed"
	"golang.org/x/sys/unix"
)

// StreamsOptions describe a bulk measurement over many TCP connections at
// once: one per entry of Flows (a flow listed twice is two connections
// between the same addresses).
type StreamsOptions struct {
	// From connects to a listener on To, on the unspecified address of
	// the flows' family, from each flow's Src to its Dst.
	From, To *testbed.Node
	Flows    []Flow
	// MSS, if > 0, is set with TCP_MAXSEG on every socket.
	MSS int
	// Omit is the warm-up before the window; Duration the window.
	Omit, Duration time.Duration
	// Window, if set, marks the window's start and end.
	Window WindowFunc
}

// StreamsResult is what a many-stream measurement saw in its window.
type StreamsResult struct {
	// Bytes received by the server over all connections in the window,
	// and the window's exact length.
	Bytes   int64
	Elapsed time.Duration
	// PerFlow is each connection's share of Bytes, in the order of
	// Flows.
	PerFlow []int64
	// Retransmits sums the senders' tcpi_total_retrans growth;
	// ReordSeen their tcpi_reord_seen growth (reordering the senders
	// inferred from SACKs and DSACKs).
	Retransmits, ReordSeen uint32
	// MSS is the smallest tcpi_snd_mss at the end of the window.
	MSS uint32
	// Idle counts the connections that moved nothing in the window
	// (starved: waiting out a retransmission timeout, say). One that
	// moved nothing in the whole run is an error instead.
	Idle int
}

// Bitrate returns the aggregate goodput in bits per second.
func (r StreamsResult) Bitrate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Bytes) * 8 / r.Elapsed.Seconds()
}

// Streams runs len(o.Flows) bulk transfers at once, each from its own
// goroutine, for o.Omit + o.Duration and measures the receiver's goodput
// per connection over the window. A connection that moved nothing in the
// whole run (warm-up and window) is an error: every flow must have gone
// through.
func Streams(ctx context.Context, o StreamsOptions) (StreamsResult, error) {
	var res StreamsResult
	if o.From == nil || o.To == nil || len(o.Flows) == 0 || o.Duration <= 0 {
		return res, errors.New("load: Streams needs From, To, flows and Duration > 0")
	}
	ctx, cancel := context.WithTimeout(ctx, o.Omit+o.Duration+60*time.Second)
	defer cancel()
	control := mssControl(o.MSS)
	unspec := netip.IPv4Unspecified()
	if o.Flows[0].Dst.Is6() {
		unspec = netip.IPv6Unspecified()
	}
	var ln net.Listener
	if err := o.To.Do(func() error {
		var err error
		ln, err = (&net.ListenConfig{Control: control}).Listen(ctx, "tcp", netip.AddrPortFrom(unspec, 0).String())
		return err
	}); err != nil {
		return res, fmt.Errorf("load: listen in %s: %w", o.To.Role, err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).AddrPort().Port()

	// The receiver counts per remote address and port; the sender
	// learns each flow's local address when it connects.
	var (
		mu       sync.Mutex
		counters = map[netip.AddrPort]*atomic.Int64{}
		accepted []net.Conn
		readers  sync.WaitGroup
	)
	counter := func(ap netip.AddrPort) *atomic.Int64 {
		mu.Lock()
		defer mu.Unlock()
		c := counters[ap]
		if c == nil {
			c = new(atomic.Int64)
			counters[ap] = c
		}
		return c
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			accepted = append(accepted, c)
			mu.Unlock()
			cnt := counter(unmap(c.RemoteAddr().(*net.TCPAddr).AddrPort()))
			readers.Add(1)
			go func() {
				defer readers.Done()
				buf := make([]byte, 256<<10)
				for {
					n, err := c.Read(buf)
					cnt.Add(int64(n))
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	defer func() {
		ln.Close()
		mu.Lock()
		for _, c := range accepted {
			c.Close()
		}
		mu.Unlock()
		readers.Wait()
	}()

	conns := make([]*net.TCPConn, len(o.Flows))
	cnts := make([]*atomic.Int64, len(o.Flows))
	defer func() {
		for _, c := range conns {
			if c != nil {
				_ = c.SetLinger(0)
				c.Close()
			}
		}
	}()
	for i, f := range o.Flows {
		if err := o.From.Do(func() error {
			d := &net.Dialer{Control: control, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(f.Src, 0))}
			c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(f.Dst, port).String())
			if err == nil {
				conns[i] = c.(*net.TCPConn)
			}
			return err
		}); err != nil {
			return res, fmt.Errorf("load: connect %v -> %v in %s: %w", f.Src, f.Dst, o.From.Role, err)
		}
		cnts[i] = counter(unmap(conns[i].LocalAddr().(*net.TCPAddr).AddrPort()))
	}

	var stopping atomic.Bool
	sendErr := make(chan error, len(conns))
	buf := payload()
	for _, c := range conns {
		go send(c, buf, &stopping, sendErr)
	}
	stop := func() {
		stopping.Store(true)
		for _, c := range conns {
			_ = c.SetWriteDeadline(time.Now())
		}
	}
	defer stop()
	wait := func(d time.Duration) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case err := <-sendErr:
			if err == nil {
				err = errors.New("a sender stopped")
			}
			return fmt.Errorf("sender failed: %w", err)
		}
	}
	info := func() (retr, reord, mss uint32, err error) {
		for _, c := range conns {
			ti, err := tcpInfoOf(c)
			if err != nil {
				return 0, 0, 0, err
			}
			retr += ti.Total_retrans
			reord += ti.Reord_seen
			if mss == 0 || ti.Snd_mss < mss {
				mss = ti.Snd_mss
			}
		}
		return retr, reord, mss, nil
	}
	snap := func() []int64 {
		out := make([]int64, len(cnts))
		for i, c := range cnts {
			out[i] = c.Load()
		}
		return out
	}
	if err := wait(o.Omit); err != nil {
		return res, fmt.Errorf("load: %d TCP streams %s -> %s during warm-up: %w", len(conns), o.From.Role, o.To.Role, err)
	}
	retr0, reord0, _, err := info()
	if err != nil {
		return res, err
	}
	b0, t0 := snap(), time.Now()
	if o.Window != nil {
		o.Window(true)
	}
	werr := wait(o.Duration)
	b1, t1 := snap(), time.Now()
	if o.Window != nil {
		o.Window(false)
	}
	retr1, reord1, mss, _ := info()
	res = StreamsResult{Elapsed: t1.Sub(t0), PerFlow: make([]int64, len(b1)),
		Retransmits: retr1 - retr0, ReordSeen: reord1 - reord0, MSS: mss}
	var dead []int
	for i := range b1 {
		res.PerFlow[i] = b1[i] - b0[i]
		res.Bytes += res.PerFlow[i]
		if res.PerFlow[i] <= 0 {
			res.Idle++
		}
		if b1[i] <= 0 {
			dead = append(dead, i)
		}
	}
	if werr != nil {
		return res, fmt.Errorf("load: %d TCP streams %s -> %s: %w", len(conns), o.From.Role, o.To.Role, werr)
	}
	if len(dead) > 0 {
		f := o.Flows[dead[0]]
		return res, fmt.Errorf("load: %d of %d TCP streams moved nothing in %v (the first: %v -> %v)",
			len(dead), len(conns), o.Omit+o.Duration, f.Src, f.Dst)
	}
	return res, nil
}

// unmap turns a v4-mapped IPv6 address into its IPv4 one.
func unmap(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// mssControl returns a socket control function that sets TCP_MAXSEG, or
// nil for the path's own MSS.
func mssControl(mss int) func(network, address string, c syscall.RawConn) error {
	if mss <= 0 {
		return nil
	}
	return func(network, address string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = setMSS(int(fd), mss)
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("TCP_MAXSEG %d: %w", mss, serr)
		}
		return nil
	}
}

func setMSS(fd, mss int) error {
	return unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_MAXSEG, mss)
}

// tcpInfoOf reads conn's TCP_INFO.
func tcpInfoOf(conn *net.TCPConn) (*unix.TCPInfo, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	var info *unix.TCPInfo
	var ierr error
	if err := raw.Control(func(fd uintptr) {
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	}); err != nil {
		return nil, err
	}
	if ierr != nil {
		return nil, fmt.Errorf("load: TCP_INFO: %w", ierr)
	}
	return info, nil
}
