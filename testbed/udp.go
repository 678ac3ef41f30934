package testbed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// UDPReceiver counts the datagrams that arrive on a UDP socket in a
// namespace.
type UDPReceiver struct {
	conn    *net.UDPConn
	packets atomic.Uint64
	mu      sync.Mutex
	sizes   []int
	done    chan struct{}
}

// maxRecordedSizes bounds UDPReceiver.Sizes.
const maxRecordedSizes = 4096

// ListenUDP opens a UDP socket on addr in the namespace (port 0 picks one)
// and counts what arrives until Close.
func (n *Node) ListenUDP(addr netip.AddrPort) (*UDPReceiver, error) {
	var conn *net.UDPConn
	err := n.Do(func() error {
		var err error
		conn, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("testbed: listen udp %v in %s: %w", addr, n.Name, err)
	}
	r := &UDPReceiver{conn: conn, done: make(chan struct{})}
	go r.loop()
	return r, nil
}

func (r *UDPReceiver) loop() {
	defer close(r.done)
	buf := make([]byte, 65536)
	for {
		k, err := r.conn.Read(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue // ICMP errors surface as read errors; keep counting
		}
		r.packets.Add(1)
		r.mu.Lock()
		if len(r.sizes) < maxRecordedSizes {
			r.sizes = append(r.sizes, k)
		}
		r.mu.Unlock()
	}
}

// Addr returns the local address the receiver listens on.
func (r *UDPReceiver) Addr() netip.AddrPort {
	return r.conn.LocalAddr().(*net.UDPAddr).AddrPort()
}

// Packets returns how many datagrams arrived.
func (r *UDPReceiver) Packets() uint64 { return r.packets.Load() }

// Sizes returns the payload sizes of the first datagrams, in order of
// arrival.
func (r *UDPReceiver) Sizes() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.sizes...)
}

// WaitPackets waits until at least n datagrams arrived or ctx ends.
func (r *UDPReceiver) WaitPackets(ctx context.Context, n uint64) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for r.Packets() < n {
		select {
		case <-ctx.Done():
			return fmt.Errorf("testbed: %d of %d datagrams arrived: %w", r.Packets(), n, ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// Close closes the socket and waits for the reader to finish.
func (r *UDPReceiver) Close() error {
	err := r.conn.Close()
	<-r.done
	return err
}

// UDPSendOptions tune SendUDP.
type UDPSendOptions struct {
	// Size is the payload size of each datagram; 0 means 64.
	Size int
	// Payload, if not nil, is each datagram's payload as given (Size is
	// then ignored).
	Payload []byte
	// Count is the number of datagrams; 0 means 1.
	Count int
	// Interval separates them; 0 sends them back to back.
	Interval time.Duration
	// DontFragment sets DF (IPv4) and forbids fragmentation (IPv6),
	// ignoring the cached path MTU (IP_PMTUDISC_PROBE): the datagram
	// leaves as one packet or not at all.
	DontFragment bool
	// Source, if valid, is the local address.
	Source netip.Addr
}

// SendUDP sends datagrams from the namespace to dst and returns how many the
// kernel accepted. It stops at the first send error, returning it; ctx
// bounds it.
func (n *Node) SendUDP(ctx context.Context, dst netip.AddrPort, o UDPSendOptions) (int, error) {
	if o.Size <= 0 {
		o.Size = 64
	}
	if o.Count <= 0 {
		o.Count = 1
	}
	conn, err := n.dialUDP(dst, o.Source, o.DontFragment)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	payload := o.Payload
	if payload == nil {
		payload = make([]byte, o.Size)
		for i := range payload {
			payload[i] = byte(i)
		}
	}
	for i := range o.Count {
		if err := ctx.Err(); err != nil {
			return i, err
		}
		if _, err := conn.Write(payload); err != nil {
			return i, fmt.Errorf("testbed: send udp to %v: %w", dst, err)
		}
		if o.Interval > 0 && i+1 < o.Count {
			select {
			case <-ctx.Done():
				return i + 1, ctx.Err()
			case <-time.After(o.Interval):
			}
		}
	}
	return o.Count, nil
}

// dialUDP opens a connected UDP socket in the namespace.
func (n *Node) dialUDP(dst netip.AddrPort, src netip.Addr, df bool) (*net.UDPConn, error) {
	var conn *net.UDPConn
	err := n.Do(func() error {
		var laddr *net.UDPAddr
		if src.IsValid() {
			laddr = net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0))
		}
		var err error
		conn, err = net.DialUDP("udp", laddr, net.UDPAddrFromAddrPort(dst))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("testbed: udp socket in %s to %v: %w", n.Name, dst, err)
	}
	if !df {
		return conn, nil
	}
	if err := setDF(conn, dst.Addr().Is6()); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// setDF sets DF / no fragmentation ignoring the path MTU, and asks for ICMP
// errors on the error queue.
func setDF(conn *net.UDPConn, v6 bool) error {
	raw, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		f := int(fd)
		if v6 {
			serr = errors.Join(
				unix.SetsockoptInt(f, unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_PROBE),
				unix.SetsockoptInt(f, unix.IPPROTO_IPV6, unix.IPV6_DONTFRAG, 1),
				unix.SetsockoptInt(f, unix.IPPROTO_IPV6, unix.IPV6_RECVERR, 1))
		} else {
			serr = errors.Join(
				unix.SetsockoptInt(f, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_PROBE),
				unix.SetsockoptInt(f, unix.IPPROTO_IP, unix.IP_RECVERR, 1))
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("testbed: set DF: %w", err)
	}
	return nil
}

// ICMPError is an ICMP error reported to a socket (IP_RECVERR).
type ICMPError struct {
	// Offender is the address the error came from.
	Offender netip.Addr
	// Type and Code are the ICMP or ICMPv6 type and code.
	Type, Code uint8
	// MTU is the next-hop MTU of a "fragmentation needed" (type 3 code 4)
	// or "packet too big" (ICMPv6 type 2) error, else 0.
	MTU int
	// Errno is the error the kernel maps it to (EMSGSIZE for both).
	Errno unix.Errno
}

// String describes the error.
func (e *ICMPError) String() string {
	return fmt.Sprintf("ICMP type %d code %d from %v, mtu %d (%v)", e.Type, e.Code, e.Offender, e.MTU, e.Errno)
}

// ProbePathMTU sends one UDP datagram with DF whose IP packet is size bytes
// long from the namespace to dst, and waits up to wait for an ICMP error
// about it. It returns nil and no error when none came. The datagram is sent
// even if the kernel already knows a smaller path MTU.
func (n *Node) ProbePathMTU(ctx context.Context, dst netip.AddrPort, size int, wait time.Duration) (*ICMPError, error) {
	v6 := dst.Addr().Is6()
	hdr := 28
	if v6 {
		hdr = 48
	}
	if size < hdr {
		return nil, fmt.Errorf("testbed: probe size %d below the %d header bytes", size, hdr)
	}
	conn, err := n.dialUDP(dst, netip.Addr{}, true)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if _, err := conn.Write(make([]byte, size-hdr)); err != nil {
		return nil, fmt.Errorf("testbed: probe of %d bytes to %v: %w", size, dst, err)
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		var ie *ICMPError
		var rerr error
		_ = raw.Control(func(fd uintptr) { ie, rerr = readErrQueue(int(fd)) })
		if rerr != nil || ie != nil {
			return ie, rerr
		}
		select {
		case <-ctx.Done():
			return nil, nil
		case <-t.C:
		}
	}
}

// readErrQueue reads one message from the socket's error queue; nil, nil
// when it is empty.
func readErrQueue(fd int) (*ICMPError, error) {
	buf := make([]byte, 2048)
	oob := make([]byte, 512)
	_, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_ERRQUEUE|unix.MSG_DONTWAIT)
	if errors.Is(err, unix.EAGAIN) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("testbed: read error queue: %w", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return nil, fmt.Errorf("testbed: parse error queue message: %w", err)
	}
	for _, m := range msgs {
		v4 := m.Header.Level == unix.IPPROTO_IP && m.Header.Type == unix.IP_RECVERR
		v6 := m.Header.Level == unix.IPPROTO_IPV6 && m.Header.Type == unix.IPV6_RECVERR
		if !v4 && !v6 {
			continue
		}
		const eeLen = 16 // struct sock_extended_err
		d := m.Data
		if len(d) < eeLen {
			return nil, fmt.Errorf("testbed: short sock_extended_err (%d bytes)", len(d))
		}
		ee := &ICMPError{
			Errno: unix.Errno(ne.Uint32(d[0:])),
			Type:  d[5],
			Code:  d[6],
		}
		origin := d[4]
		info := int(ne.Uint32(d[8:]))
		if (origin == unix.SO_EE_ORIGIN_ICMP && ee.Type == 3 && ee.Code == 4) ||
			(origin == unix.SO_EE_ORIGIN_ICMP6 && ee.Type == 2) {
			ee.MTU = info
		}
		if origin != unix.SO_EE_ORIGIN_ICMP && origin != unix.SO_EE_ORIGIN_ICMP6 {
			// A locally generated error (the kernel refused the send).
			ee.MTU = info
			ee.Type, ee.Code = 0, 0
		}
		off := d[eeLen:]
		if len(off) >= 8 && ne.Uint16(off) == unix.AF_INET {
			ee.Offender = netip.AddrFrom4([4]byte(off[4:8]))
		} else if len(off) >= 24 && ne.Uint16(off) == unix.AF_INET6 {
			ee.Offender = netip.AddrFrom16([16]byte(off[8:24]))
		}
		return ee, nil
	}
	return nil, errors.New("testbed: error queue message without IP_RECVERR")
}
