package conn

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/packet"
)

// SocketConfig says how to open the outer sockets.
type SocketConfig struct {
	// Mark is set with SO_MARK on every socket so that the routing rules
	// keep the outer packets out of the TUN.
	Mark uint32
	// EncapPort is the UDP port for ESP-in-UDP; 0 means DefaultEncapPort.
	EncapPort uint16
	// NoIPv6 opens only the IPv4 sockets.
	NoIPv6 bool
	// Batch is the number of messages per recvmmsg/sendmmsg.
	Batch int
	// RecvBuffer, if > 0, sets SO_RCVBUFFORCE on the receiving sockets.
	RecvBuffer int
	// NoGSO sends all ESP-in-UDP through the raw sockets and leaves
	// UDP_GRO off on the UDP sockets.
	NoGSO bool
}

// Sockets are espd's outer sockets, the Bind of the kernel: raw ESP (IP
// protocol 50) and ESP-in-UDP receivers for IPv4 and IPv6, raw
// IPPROTO_RAW senders (IP_HDRINCL) for the packets that need a complete
// IP header written by espd (raw ESP, whose TTL, DSCP, ECN and DF are
// espd's to set per packet, and outer fragments), and the encapsulation
// port's UDP sockets, which receive ESP-in-UDP, IKE and keepalives (and
// keep the kernel from answering them with port unreachable) and, unless
// NoGSO, send ESP-in-UDP several datagrams per message (UDP_SEGMENT) and
// receive with UDP_GRO (gso_linux.go). StartIKE adds the IKE port
// (ike_linux.go).
type Sockets struct {
	cfg    SocketConfig
	recv   []Receiver
	udp    [2]*receiver // the encapsulation port's receivers, IPv4 and IPv6
	send   *rawSender
	counts ioCounts
	ike    ikeRelay
}

var _ Bind = (*Sockets)(nil)

// OpenSockets opens the outer sockets in the calling thread's network
// namespace.
func OpenSockets(cfg SocketConfig) (s *Sockets, err error) {
	if cfg.EncapPort == 0 {
		cfg.EncapPort = DefaultEncapPort
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 128
	}
	s = &Sockets{cfg: cfg}
	opened := s // the error returns below set s to nil
	defer func() {
		if err != nil {
			opened.Close()
		}
	}()
	fams := []int{unix.AF_INET}
	if !cfg.NoIPv6 {
		fams = append(fams, unix.AF_INET6)
	}
	for i, fam := range fams {
		r, err := openRawESP(fam, cfg, &s.counts)
		if err != nil {
			return nil, err
		}
		s.recv = append(s.recv, r)
		u, err := openUDP(fam, cfg, &s.counts)
		if err != nil {
			return nil, err
		}
		s.recv = append(s.recv, u)
		s.udp[i] = u
	}
	s.send, err = openRawSender(cfg, &s.counts)
	if err != nil {
		return nil, err
	}
	if !cfg.NoGSO {
		for _, u := range s.udp {
			if u != nil {
				s.send.useGSO(u, cfg.Batch)
			}
		}
	}
	s.ike.init(s)
	return s, nil
}

// Receivers returns the receiving sockets: raw ESP and UDP, per family.
func (s *Sockets) Receivers() []Receiver { return s.recv }

// Send implements Bind.
func (s *Sockets) Send(pkts []Packet) (int, error) { return s.send.Send(pkts) }

// Stats implements Bind.
func (s *Sockets) Stats() Stats {
	c := &s.counts
	return Stats{
		RecvCalls: c.recvCalls.Load(), RecvDatagrams: c.recvDatagrams.Load(),
		SendCalls: c.sendCalls.Load(), SendMessages: c.sendMessages.Load(),
	}
}

// Close closes every socket, the IKE port's included.
func (s *Sockets) Close() error {
	var errs []error
	if err := s.ike.stop(); err != nil && !errors.Is(err, ErrIKEOff) {
		errs = append(errs, err)
	}
	for _, r := range s.recv {
		errs = append(errs, r.Close())
	}
	if s.send != nil {
		errs = append(errs, s.send.Close())
	}
	return errors.Join(errs...)
}

func famName(fam int) string {
	if fam == unix.AF_INET6 {
		return "IPv6"
	}
	return "IPv4"
}

// needs adds to err, if it is the kernel's EPERM or EACCES, the
// capability that espd, run as a user other than root (the systemd units),
// lacks.
func needs(err error, capability string) error {
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		return fmt.Errorf("%w (needs %s)", err, capability)
	}
	return err
}

func socket(fam, typ, proto int, cfg SocketConfig, what string) (int, error) {
	fd, err := unix.Socket(fam, typ|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		if typ == unix.SOCK_RAW {
			err = needs(err, "CAP_NET_RAW")
		}
		return -1, fmt.Errorf("conn: %s %s socket: %w", famName(fam), what, err)
	}
	if cfg.Mark != 0 {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_MARK, int(cfg.Mark)); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("conn: SO_MARK on %s %s socket: %w", famName(fam), what, needs(err, "CAP_NET_ADMIN or CAP_NET_RAW"))
		}
	}
	return fd, nil
}

type sockopt struct{ level, opt, value int }

func setsockopts(fd int, what string, opts ...sockopt) error {
	for _, o := range opts {
		if err := unix.SetsockoptInt(fd, o.level, o.opt, o.value); err != nil {
			switch {
			case o.level == unix.SOL_SOCKET && o.opt == unix.SO_MARK:
				err = needs(err, "CAP_NET_ADMIN or CAP_NET_RAW")
			case o.level == unix.SOL_SOCKET && o.opt == unix.SO_RCVBUFFORCE:
				err = needs(err, "CAP_NET_ADMIN")
			}
			return fmt.Errorf("conn: %s: setsockopt(%d, %d): %w", what, o.level, o.opt, err)
		}
	}
	return nil
}

// setAndBind sets opts on the socket fd and binds it to sa; on failure it
// closes fd.
func setAndBind(fd int, what string, sa unix.Sockaddr, opts []sockopt) error {
	if err := setsockopts(fd, what, opts...); err != nil {
		unix.Close(fd)
		return err
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		if port := sockaddrPort(sa); port > 0 && port < 1024 {
			err = needs(err, "CAP_NET_BIND_SERVICE for a port below 1024")
		}
		if port := sockaddrPort(sa); port > 0 && errors.Is(err, unix.EADDRINUSE) {
			err = fmt.Errorf("%w: %s", err, udpPortHolders(port))
		}
		return fmt.Errorf("conn: bind %s: %w", what, err)
	}
	return nil
}

// sockaddrPort returns sa's port (0 for other than IPv4 and IPv6).
func sockaddrPort(sa unix.Sockaddr) int {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return a.Port
	case *unix.SockaddrInet6:
		return a.Port
	}
	return 0
}

// receiver reads one outer socket.
type receiver struct {
	c    *mmsgConn
	fam  int
	udp  bool
	port uint16
	gro  *groReader // UDP socket with UDP_GRO on

	closeOnce sync.Once
	closeErr  error
}

func openRawESP(fam int, cfg SocketConfig, counts *ioCounts) (*receiver, error) {
	fd, err := socket(fam, unix.SOCK_RAW, unix.IPPROTO_ESP, cfg, "raw ESP")
	if err != nil {
		return nil, err
	}
	var opts []sockopt
	if fam == unix.AF_INET6 {
		// The IPv6 raw socket does not deliver the IPv6 header.
		opts = append(opts,
			sockopt{unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1},
			sockopt{unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, 1})
	}
	if cfg.RecvBuffer > 0 {
		opts = append(opts, sockopt{unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, cfg.RecvBuffer})
	}
	if err := setsockopts(fd, famName(fam)+" raw ESP", opts...); err != nil {
		unix.Close(fd)
		return nil, err
	}
	c, err := newMmsgConn(fd, "esp-raw-"+famName(fam), cfg.Batch)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	c.counts = counts
	return &receiver{c: c, fam: fam}, nil
}

func openUDP(fam int, cfg SocketConfig, counts *ioCounts) (*receiver, error) {
	fd, err := socket(fam, unix.SOCK_DGRAM, unix.IPPROTO_UDP, cfg, "UDP")
	if err != nil {
		return nil, err
	}
	what := fmt.Sprintf("%s UDP port %d", famName(fam), cfg.EncapPort)
	var opts []sockopt
	var sa unix.Sockaddr
	if fam == unix.AF_INET6 {
		opts = append(opts,
			sockopt{unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1},
			sockopt{unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1},
			sockopt{unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, 1})
		sa = &unix.SockaddrInet6{Port: int(cfg.EncapPort)}
	} else {
		opts = append(opts,
			sockopt{unix.IPPROTO_IP, unix.IP_PKTINFO, 1},
			sockopt{unix.IPPROTO_IP, unix.IP_RECVTOS, 1})
		sa = &unix.SockaddrInet4{Port: int(cfg.EncapPort)}
	}
	if cfg.RecvBuffer > 0 {
		opts = append(opts, sockopt{unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, cfg.RecvBuffer})
	}
	if err := setAndBind(fd, what, sa, opts); err != nil {
		return nil, err
	}
	c, err := newMmsgConn(fd, "esp-udp-"+famName(fam), cfg.Batch)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	c.counts = counts
	r := &receiver{c: c, fam: fam, udp: true, port: cfg.EncapPort}
	// UDP_GRO (Linux 5.0): a run of datagrams sent with UDP_SEGMENT, or
	// coalesced by the NIC's GRO, arrives as one. Without it, the kernel
	// splits such runs before queueing them.
	if !cfg.NoGSO && unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_GRO, 1) == nil {
		r.gro = newGROReader()
	}
	return r, nil
}

// Receive implements Receiver.
func (r *receiver) Receive(msgs []Message) (int, error) {
	n := min(len(msgs), len(r.c.hdrs))
	for i := range n {
		if len(msgs[i].Buf) <= RecvOffset {
			return 0, fmt.Errorf("conn: receive buffer of %d bytes", len(msgs[i].Buf))
		}
		if r.gro == nil {
			r.c.prepare(i, msgs[i].Buf[RecvOffset:], true, 0)
		}
	}
	if r.gro != nil {
		return r.receiveGRO(msgs[:n])
	}
	n, err := r.c.recv(n)
	if err != nil {
		return 0, err
	}
	for i := range n {
		r.parse(i, &msgs[i])
	}
	return n, nil
}

// parse fills in m from message i of the last recvmmsg.
func (r *receiver) parse(i int, m *Message) {
	h := &r.c.hdrs[i]
	m.Start, m.End, m.UDP, m.TOS, m.Err = 0, 0, r.udp, 0, nil
	m.Src, m.Dst = netip.AddrPort{}, netip.AddrPort{}
	if h.hdr.Flags&unix.MSG_TRUNC != 0 {
		m.Err = ErrTruncated
		return
	}
	m.Start, m.End = RecvOffset, RecvOffset+int(h.len)
	src, sport := r.peer(i)
	var dst netip.Addr
	parseControl(r.c.control(i), &dst, &m.TOS)
	if r.fam == unix.AF_INET && !r.udp {
		// The raw IPv4 socket delivers the IP header.
		ip, err := packet.ParseIPv4Header(m.Buf[m.Start:m.End])
		if err != nil {
			m.Err = ErrOuterHeader
			return
		}
		if ip.Protocol != packet.ProtoESP {
			m.Err = ErrNotESP
			return
		}
		m.End = m.Start + int(ip.TotalLen)
		m.Start += ip.HeaderLen
		m.TOS = ip.TOS
		src, dst = ip.Src, ip.Dst
	}
	if r.udp {
		m.Src = netip.AddrPortFrom(src, sport)
		m.Dst = netip.AddrPortFrom(dst, r.port)
	} else {
		m.Src = netip.AddrPortFrom(src, 0)
		m.Dst = netip.AddrPortFrom(dst, 0)
	}
}

// peer returns the source address and port of message i of the last
// recvmmsg.
func (r *receiver) peer(i int) (netip.Addr, uint16) {
	name := &r.c.names[i]
	if name.Family == unix.AF_INET6 {
		return netip.AddrFrom16(name.Addr), binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&name.Port))[:])
	}
	sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(name))
	return netip.AddrFrom4(sa4.Addr), binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa4.Port))[:])
}

// parseControl reads the destination address (IP_PKTINFO, IPV6_PKTINFO)
// and the TOS or traffic class (IP_TOS, IPV6_TCLASS) out of oob, and
// returns the UDP_GRO segment size (0 if none).
func parseControl(oob []byte, dst *netip.Addr, tos *uint8) (seg int) {
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(oob) {
			return seg
		}
		data := oob[unix.CmsgLen(0):l]
		switch {
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_TOS && len(data) >= 1:
			*tos = data[0]
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_PKTINFO && len(data) >= unix.SizeofInet4Pktinfo:
			*dst = netip.AddrFrom4([4]byte(data[8:12]))
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_TCLASS && len(data) >= 4:
			*tos = uint8(binary.NativeEndian.Uint32(data))
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_PKTINFO && len(data) >= unix.SizeofInet6Pktinfo:
			*dst = netip.AddrFrom16([16]byte(data[:16]))
		case h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && len(data) >= 2:
			if len(data) >= 4 {
				seg = int(binary.NativeEndian.Uint32(data))
			} else {
				seg = int(binary.NativeEndian.Uint16(data))
			}
		}
		next := unix.CmsgSpace(l - unix.CmsgLen(0))
		if next > len(oob) {
			return seg
		}
		oob = oob[next:]
	}
	return seg
}

// Close implements Receiver. Only the first call closes the socket, so
// that the data plane can stop its readers before Sockets.Close.
func (r *receiver) Close() error {
	r.closeOnce.Do(func() { r.closeErr = r.c.close() })
	return r.closeErr
}
