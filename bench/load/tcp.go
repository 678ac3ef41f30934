package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/espd/espd/testbed"
	"golang.org/x/sys/unix"
)

// WindowFunc is called with true when the measured window starts and with
// false when it ends.
type WindowFunc func(start bool)

// TCPOptions describe one TCP bulk measurement.
type TCPOptions struct {
	// From sends to a listener on To at Dst (an address of To).
	From, To *testbed.Node
	Dst      netip.Addr
	// Port is the listener's port; 0 picks a free one.
	Port uint16
	// MSS, if > 0, is set with TCP_MAXSEG on both sockets before the
	// connection; 0 leaves the path's maximum.
	MSS int
	// Omit is the warm-up before the window; Duration the window.
	Omit, Duration time.Duration
	// Window, if set, marks the window's start and end.
	Window WindowFunc
}

// TCPResult is what one TCP measurement saw in its window.
type TCPResult struct {
	// Bytes received by the server in the window, and the window's exact
	// length.
	Bytes   int64
	Elapsed time.Duration
	// Retransmits is the growth of the sender's tcpi_total_retrans over
	// the window.
	Retransmits uint32
	// MSS is the sender's tcpi_snd_mss at the end of the window.
	MSS uint32
}

// Bitrate returns the goodput in bits per second.
func (r TCPResult) Bitrate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Bytes) * 8 / r.Elapsed.Seconds()
}

// writeSize is the size of each write; the data is one random buffer sent
// over and over, so that generating it costs nothing per byte.
const writeSize = 128 << 10

// TCP runs a bulk transfer from o.From to o.To for o.Omit + o.Duration and
// measures the receiver's goodput over the window. Data is not checked
// (ESP's ICV and TCP's checksum do that); the end-to-end tests check
// content.
func TCP(ctx context.Context, o TCPOptions) (TCPResult, error) {
	var res TCPResult
	if o.From == nil || o.To == nil || !o.Dst.IsValid() || o.Duration <= 0 {
		return res, errors.New("load: TCP needs From, To, Dst and Duration > 0")
	}
	total := o.Omit + o.Duration
	ctx, cancel := context.WithTimeout(ctx, total+30*time.Second)
	defer cancel()

	control := func(network, address string, c syscall.RawConn) error {
		if o.MSS <= 0 {
			return nil
		}
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG, o.MSS)
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("TCP_MAXSEG %d: %w", o.MSS, serr)
		}
		return nil
	}
	var ln net.Listener
	if err := o.To.Do(func() error {
		var err error
		ln, err = (&net.ListenConfig{Control: control}).Listen(ctx, "tcp", netip.AddrPortFrom(o.Dst, o.Port).String())
		return err
	}); err != nil {
		return res, fmt.Errorf("load: listen in %s: %w", o.To.Role, err)
	}
	defer ln.Close()

	var received atomic.Int64
	recvDone := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			recvDone <- fmt.Errorf("accept: %w", err)
			return
		}
		defer c.Close()
		buf := make([]byte, 256<<10)
		for {
			n, err := c.Read(buf)
			received.Add(int64(n))
			if err != nil {
				if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET) {
					err = nil
				}
				recvDone <- err
				return
			}
		}
	}()

	var conn *net.TCPConn
	if err := o.From.Do(func() error {
		c, err := (&net.Dialer{Control: control}).DialContext(ctx, "tcp", ln.Addr().String())
		if err == nil {
			conn = c.(*net.TCPConn)
		}
		return err
	}); err != nil {
		ln.Close()
		return res, fmt.Errorf("load: connect from %s to %s: %w", o.From.Role, ln.Addr(), err)
	}
	defer conn.Close()

	var stopping atomic.Bool
	sendDone := make(chan error, 1)
	go send(conn, payload(), &stopping, sendDone)

	stop := func() {
		stopping.Store(true)
		_ = conn.SetLinger(0) // reset: do not drain what is still queued
		_ = conn.SetWriteDeadline(time.Now())
	}
	wait := func(d time.Duration) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case err := <-sendDone:
			sendDone <- err
			if err == nil {
				err = errors.New("sender stopped")
			}
			return fmt.Errorf("sender failed: %w", err)
		}
	}
	if err := wait(o.Omit); err != nil {
		stop()
		return res, fmt.Errorf("load: TCP %s -> %s during warm-up: %w", o.From.Role, o.Dst, err)
	}
	retr0, _, ierr := tcpInfo(conn)
	if ierr != nil {
		stop()
		return res, ierr
	}
	b0, t0 := received.Load(), time.Now()
	if o.Window != nil {
		o.Window(true)
	}
	werr := wait(o.Duration)
	b1, t1 := received.Load(), time.Now()
	if o.Window != nil {
		o.Window(false)
	}
	retr1, mss, _ := tcpInfo(conn)
	stop()
	conn.Close()
	res = TCPResult{Bytes: b1 - b0, Elapsed: t1.Sub(t0), Retransmits: retr1 - retr0, MSS: mss}
	if werr != nil {
		return res, fmt.Errorf("load: TCP %s -> %s: %w", o.From.Role, o.Dst, werr)
	}
	select {
	case <-recvDone:
	case <-time.After(5 * time.Second):
		ln.Close()
	}
	if res.Bytes <= 0 {
		return res, fmt.Errorf("load: TCP %s -> %s: nothing received in %v", o.From.Role, o.Dst, o.Duration)
	}
	return res, nil
}

// tcpInfo reads tcpi_total_retrans and tcpi_snd_mss of conn.
func tcpInfo(conn *net.TCPConn) (retrans, mss uint32, err error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var ierr error
	if err := raw.Control(func(fd uintptr) {
		var info *unix.TCPInfo
		info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
		if ierr == nil {
			retrans, mss = info.Total_retrans, info.Snd_mss
		}
	}); err != nil {
		return 0, 0, err
	}
	if ierr != nil {
		return 0, 0, fmt.Errorf("load: TCP_INFO: %w", ierr)
	}
	return retrans, mss, nil
}

// payload returns the buffer a sender writes over and over: writeSize
// random bytes, the same in every run.
func payload() []byte {
	buf := make([]byte, writeSize)
	rand.NewChaCha8([32]byte{'e', 's', 'p', 'd'}).Read(buf)
	return buf
}

// send writes buf to c until stopping is set or a write fails, then
// reports on done: nil if it was stopped (a write failing because of the
// stop included), else the write's error.
func send(c net.Conn, buf []byte, stopping *atomic.Bool, done chan<- error) {
	for !stopping.Load() {
		if _, err := c.Write(buf); err != nil {
			if stopping.Load() {
				err = nil
			}
			done <- err
			return
		}
	}
	done <- nil
}
