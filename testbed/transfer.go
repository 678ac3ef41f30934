package testbed

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultTransferTimeout bounds Transfer when neither the context nor the
// options give a deadline.
const DefaultTransferTimeout = 60 * time.Second

// TransferOptions describe one TCP bulk transfer from a sender in one
// namespace to a receiver in another.
type TransferOptions struct {
	// From sends, To receives. The receiver listens on Dst, which must be
	// an address of To.
	From, To *Node
	Dst      netip.Addr
	// Port is the receiver's port; 0 picks a free one.
	Port uint16
	// Bytes is how much data to send (> 0).
	Bytes int64
	// MSS, if > 0, is set with TCP_MAXSEG on both sockets before the
	// connection is made.
	MSS int
	// Timeout bounds the whole transfer, connection included, in addition
	// to the context; 0 means DefaultTransferTimeout.
	Timeout time.Duration
	// Seed selects the pseudo-random data (ChaCha8); the same seed sends
	// the same bytes.
	Seed uint64
	// MaxRate, if > 0, paces the sender to at most this many bytes per
	// second (SO_MAX_PACING_RATE), to keep a path below saturation.
	MaxRate uint64
}

// TransferResult is what a transfer achieved.
type TransferResult struct {
	// Bytes is how many bytes the receiver got.
	Bytes int64
	// Duration runs from the start of the connection to the receiver's
	// end of file.
	Duration time.Duration
	// Retransmits is the sender's tcpi_total_retrans at the end.
	Retransmits uint32
	// MSS is the sender's tcpi_snd_mss at the end.
	MSS uint32
	// Sent and Received are the SHA-256 of the data on each end.
	Sent, Received [sha256.Size]byte
}

// Bitrate returns the goodput in bits per second.
func (r TransferResult) Bitrate() float64 {
	if r.Duration <= 0 {
		return 0
	}
	return float64(r.Bytes) * 8 / r.Duration.Seconds()
}

// String summarizes the result.
func (r TransferResult) String() string {
	return fmt.Sprintf("%d bytes in %v (%.1f Mbit/s), mss %d, %d retransmits, sha256 %x",
		r.Bytes, r.Duration.Round(time.Millisecond), r.Bitrate()/1e6, r.MSS, r.Retransmits, r.Received[:8])
}

// ErrHashMismatch is returned when the data received is not the data sent.
var ErrHashMismatch = errors.New("testbed: SHA-256 of the received data differs from the data sent")

type recvResult struct {
	n    int64
	sum  [sha256.Size]byte
	end  time.Time
	err  error
	peer string
}

// Transfer sends o.Bytes of pseudo-random data over TCP from o.From to
// o.To and checks that the SHA-256 computed by the receiver equals the
// sender's. It returns an error wrapping ErrHashMismatch if they differ, or
// the first error of either side (including the deadline); the result is
// filled in as far as the transfer got.
func Transfer(ctx context.Context, o TransferOptions) (TransferResult, error) {
	var res TransferResult
	if o.From == nil || o.To == nil || !o.Dst.IsValid() || o.Bytes <= 0 {
		return res, errors.New("testbed: Transfer needs From, To, Dst and Bytes > 0")
	}
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = DefaultTransferTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()

	control := func(sender bool) func(network, address string, c syscall.RawConn) error {
		return func(network, address string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				if o.MSS > 0 {
					if err := unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG, o.MSS); err != nil {
						serr = fmt.Errorf("TCP_MAXSEG %d: %w", o.MSS, err)
						return
					}
				}
				if sender && o.MaxRate > 0 {
					if err := unix.SetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, o.MaxRate); err != nil {
						serr = fmt.Errorf("SO_MAX_PACING_RATE %d: %w", o.MaxRate, err)
					}
				}
			})
			if err != nil {
				return err
			}
			return serr
		}
	}

	var ln net.Listener
	err := o.To.Do(func() error {
		lc := net.ListenConfig{Control: control(false)}
		var err error
		ln, err = lc.Listen(ctx, "tcp", netip.AddrPortFrom(o.Dst, o.Port).String())
		return err
	})
	if err != nil {
		return res, fmt.Errorf("testbed: listen in %s: %w", o.To.Name, err)
	}
	defer ln.Close()
	addr := ln.Addr().String()

	recvc := make(chan recvResult, 1)
	go func() {
		var r recvResult
		defer func() { recvc <- r }()
		_ = ln.(*net.TCPListener).SetDeadline(deadline)
		c, err := ln.Accept()
		if err != nil {
			r.err = fmt.Errorf("accept: %w", err)
			return
		}
		defer c.Close()
		r.peer = c.RemoteAddr().String()
		_ = c.SetDeadline(deadline)
		h := sha256.New()
		buf := make([]byte, 256<<10)
		r.n, r.err = io.CopyBuffer(h, c, buf)
		r.end = time.Now()
		h.Sum(r.sum[:0])
		if r.err != nil {
			r.err = fmt.Errorf("receive after %d bytes: %w", r.n, r.err)
		}
	}()

	start := time.Now()
	var conn net.Conn
	err = o.From.Do(func() error {
		d := net.Dialer{Control: control(true)}
		var err error
		conn, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	if err != nil {
		ln.Close()
		<-recvc
		return res, fmt.Errorf("testbed: connect from %s to %s: %w", o.From.Name, addr, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(deadline)

	sendErr := send(conn, o.Bytes, o.Seed, &res.Sent)
	if sendErr == nil {
		sendErr = conn.(*net.TCPConn).CloseWrite()
	}
	if sendErr != nil {
		// Unblock the receiver.
		conn.Close()
	}
	r := <-recvc
	res.Bytes = r.n
	res.Received = r.sum
	if !r.end.IsZero() {
		res.Duration = r.end.Sub(start)
	}
	if raw, err := conn.(*net.TCPConn).SyscallConn(); err == nil {
		_ = raw.Control(func(fd uintptr) {
			if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
				res.Retransmits = info.Total_retrans
				res.MSS = info.Snd_mss
			}
		})
	}
	switch {
	case sendErr != nil:
		return res, fmt.Errorf("testbed: send %s -> %s: %w (receiver: %v)", o.From.Role, addr, sendErr, r.err)
	case r.err != nil:
		return res, fmt.Errorf("testbed: %s -> %s: %w", o.From.Role, addr, r.err)
	case r.n != o.Bytes:
		return res, fmt.Errorf("testbed: %s -> %s: received %d of %d bytes", o.From.Role, addr, r.n, o.Bytes)
	case r.sum != res.Sent:
		return res, fmt.Errorf("%w: %s -> %s, sent %x, received %x", ErrHashMismatch, o.From.Role, addr, res.Sent[:8], r.sum[:8])
	}
	return res, nil
}

// send writes n bytes of ChaCha8 output selected by seed and stores their
// SHA-256 in sum.
func send(w io.Writer, n int64, seed uint64, sum *[sha256.Size]byte) error {
	var key [32]byte
	for i := range 4 {
		key[i*8] = byte(seed >> (8 * i))
		key[i*8+4] = byte(seed >> (8 * (i + 4)))
	}
	rng := rand.NewChaCha8(key)
	h := sha256.New()
	buf := make([]byte, 128<<10)
	for left := n; left > 0; {
		chunk := buf[:min(int64(len(buf)), left)]
		_, _ = rng.Read(chunk)
		h.Write(chunk)
		if _, err := w.Write(chunk); err != nil {
			return fmt.Errorf("after %d bytes: %w", n-left, err)
		}
		left -= int64(len(chunk))
	}
	h.Sum(sum[:0])
	return nil
}
