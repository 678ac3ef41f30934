package load

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/espd/espd/testbed"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// batchConn reads and writes batches of datagrams (recvmmsg, sendmmsg).
// ipv4.Message and ipv6.Message are the same type.
type batchConn interface {
	ReadBatch(ms []ipv4.Message, flags int) (int, error)
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

func newBatchConn(c *net.UDPConn, v6 bool) batchConn {
	if v6 {
		return ipv6.NewPacketConn(c)
	}
	return ipv4.NewPacketConn(c)
}

// UDPOptions describe one small-datagram packet-rate measurement.
type UDPOptions struct {
	// From floods datagrams to a receiver on To at Dst.
	From, To *testbed.Node
	Dst      netip.Addr
	// Port is the receiver's port; 0 picks a free one.
	Port uint16
	// Size is the UDP payload size; 0 means 64.
	Size int
	// Omit is the warm-up before the window; Duration the window.
	Omit, Duration time.Duration
	// Window, if set, marks the window's start and end.
	Window WindowFunc
}

// UDPResult is what one UDP measurement saw in its window.
type UDPResult struct {
	// Sent is what the sender's kernel accepted, Received what reached
	// the receiving socket, both counted over the window.
	Sent, Received uint64
	Elapsed        time.Duration
	// Size is the payload size.
	Size int
}

// PacketRate returns the datagrams received per second.
func (r UDPResult) PacketRate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Received) / r.Elapsed.Seconds()
}

// Loss returns the share of the datagrams sent in the window that did not
// arrive in it (approximate at the window's edges).
func (r UDPResult) Loss() float64 {
	if r.Sent == 0 || r.Received >= r.Sent {
		return 0
	}
	return 1 - float64(r.Received)/float64(r.Sent)
}

// udpBatch is how many datagrams one sendmmsg/recvmmsg carries.
const udpBatch = 64

// UDP floods o.Dst with datagrams of o.Size bytes from o.From as fast as
// the sender's socket takes them (sendmmsg batches) and counts what the
// receiver gets (recvmmsg batches) over the window.
func UDP(ctx context.Context, o UDPOptions) (UDPResult, error) {
	if o.Size <= 0 {
		o.Size = 64
	}
	res := UDPResult{Size: o.Size}
	if o.From == nil || o.To == nil || !o.Dst.IsValid() || o.Duration <= 0 {
		return res, errors.New("load: UDP needs From, To, Dst and Duration > 0")
	}
	ctx, cancel := context.WithTimeout(ctx, o.Omit+o.Duration+30*time.Second)
	defer cancel()

	var rx *net.UDPConn
	if err := o.To.Do(func() error {
		var err error
		rx, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(o.Dst, o.Port)))
		return err
	}); err != nil {
		return res, fmt.Errorf("load: UDP listen in %s: %w", o.To.Role, err)
	}
	defer rx.Close()
	_ = rx.SetReadBuffer(4 << 20)
	dst := rx.LocalAddr().(*net.UDPAddr).AddrPort()

	var tx *net.UDPConn
	if err := o.From.Do(func() error {
		var err error
		tx, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
		return err
	}); err != nil {
		return res, fmt.Errorf("load: UDP socket in %s: %w", o.From.Role, err)
	}
	defer tx.Close()

	var received, sent atomic.Uint64
	var stopping atomic.Bool
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		pc := newBatchConn(rx, o.Dst.Is6())
		msgs := make([]ipv4.Message, udpBatch)
		for i := range msgs {
			msgs[i].Buffers = [][]byte{make([]byte, 2048)}
		}
		for {
			n, err := pc.ReadBatch(msgs, 0)
			if n > 0 {
				received.Add(uint64(n))
			}
			if err != nil {
				if stopping.Load() || errors.Is(err, net.ErrClosed) {
					return
				}
				continue // ICMP errors and the like: keep counting
			}
		}
	}()
	sendDone := make(chan error, 1)
	go func() {
		pc := newBatchConn(tx, o.Dst.Is6())
		payload := make([]byte, o.Size)
		msgs := make([]ipv4.Message, udpBatch)
		for i := range msgs {
			msgs[i].Buffers = [][]byte{payload}
		}
		for !stopping.Load() {
			n, err := pc.WriteBatch(msgs, 0)
			if n > 0 {
				sent.Add(uint64(n))
			}
			if err != nil {
				if stopping.Load() {
					break
				}
				if errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EAGAIN) {
					continue // queue full, or an ICMP error reported late
				}
				sendDone <- err
				return
			}
		}
		sendDone <- nil
	}()
	stop := func() {
		stopping.Store(true)
		_ = tx.SetWriteDeadline(time.Now())
		_ = rx.SetReadDeadline(time.Now())
	}
	defer func() {
		stop()
		<-recvDone
	}()
	wait := func(d time.Duration) error {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case err := <-sendDone:
			if err == nil {
				err = errors.New("sender stopped")
			}
			return err
		}
	}
	if err := wait(o.Omit); err != nil {
		return res, fmt.Errorf("load: UDP %s -> %v: %w", o.From.Role, dst, err)
	}
	s0, r0, t0 := sent.Load(), received.Load(), time.Now()
	if o.Window != nil {
		o.Window(true)
	}
	werr := wait(o.Duration)
	s1, r1, t1 := sent.Load(), received.Load(), time.Now()
	if o.Window != nil {
		o.Window(false)
	}
	res.Sent, res.Received, res.Elapsed = s1-s0, r1-r0, t1.Sub(t0)
	if werr != nil {
		return res, fmt.Errorf("load: UDP %s -> %v: %w", o.From.Role, dst, werr)
	}
	if res.Received == 0 {
		return res, fmt.Errorf("load: UDP %s -> %v: nothing received of %d datagrams", o.From.Role, dst, res.Sent)
	}
	return res, nil
}
