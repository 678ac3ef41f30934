package dataplane

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/esp"
)

// DefaultIKEPort is IKE's UDP port (RFC 7296).
const DefaultIKEPort = 500

// IKEPacket is one IKE datagram handed between espd's UDP ports and an IKE
// daemon (IKE hand-off).
type IKEPacket struct {
	// Src and Dst are the datagram's addresses and ports. For SendIKE an
	// invalid Src address lets the kernel choose the source address.
	Src, Dst netip.AddrPort
	// Data is the UDP payload as on the wire: on the encapsulation (NAT-T)
	// port it starts with the 4-byte non-ESP marker.
	Data []byte
}

// IKEHandler receives the IKE datagrams that arrive: everything on the IKE
// port, the non-ESP-marked datagrams on the encapsulation port. It is
// called from receiving goroutines, must not block and must copy p.Data
// to keep it.
type IKEHandler func(p IKEPacket)

// IKEStats count the IKE hand-off's datagrams.
type IKEStats struct {
	// Received counts datagrams handed to the handler (both ports).
	Received uint64
	// Sent counts datagrams sent for the IKE daemon; SendErrors those the
	// kernel refused; Refused those SendIKE refused (wrong port, ESP on
	// the NAT-T port, ...).
	Sent, SendErrors, Refused uint64
	// ReadErrors counts failed reads of the IKE port's sockets.
	ReadErrors uint64
}

// ikeState is a Device's IKE hand-off. It lives outside Device (in
// ikeStates) so that the pipeline's files need only one call into it.
type ikeState struct {
	d       *Device
	port    uint16
	handler IKEHandler
	socks   []*ikeSocket
	wg      sync.WaitGroup
	closing atomic.Bool

	received, sent, sendErrors, refused, readErrors atomic.Uint64
}

// ikeSocket is one UDP socket on the IKE port.
type ikeSocket struct {
	fam  int
	conn *net.UDPConn
}

// ikeStates maps a *Device to its *ikeState while the hand-off runs.
var ikeStates sync.Map

// Errors of the IKE hand-off.
var (
	ErrIKEOff       = errors.New("dataplane: IKE hand-off not started")
	ErrIKERunning   = errors.New("dataplane: IKE hand-off already started")
	errIKENoUDPSock = errors.New("dataplane: no socket on the encapsulation port for this family")
)

// StartIKE takes over the IKE port (UDP port, 0 meaning DefaultIKEPort)
// in the calling thread's network namespace, next to the encapsulation
// port the device already owns, and hands every IKE datagram that arrives
// on either to h: espd then owns both of IKE's ports, keeps ESP-in-UDP for
// itself and passes IKE to the IKE daemon, whose datagrams SendIKE sends.
// Call it after Start; StopIKE ends it (before Close).
func (d *Device) StartIKE(port uint16, h IKEHandler) error {
	if h == nil {
		return errors.New("dataplane: StartIKE without a handler")
	}
	if port == 0 {
		port = DefaultIKEPort
	}
	if port == d.cfg.EncapPort {
		return fmt.Errorf("dataplane: IKE port %d is the encapsulation port", port)
	}
	d.mu.Lock()
	started := d.started && !d.closed
	d.mu.Unlock()
	if !started {
		return errors.New("dataplane: StartIKE before Start")
	}
	st := &ikeState{d: d, port: port, handler: h}
	if _, loaded := ikeStates.LoadOrStore(d, st); loaded {
		return ErrIKERunning
	}
	fams := []int{unix.AF_INET}
	if !d.cfg.NoIPv6 {
		fams = append(fams, unix.AF_INET6)
	}
	for _, fam := range fams {
		s, err := openIKESocket(fam, port, d.cfg.Mark)
		if err != nil {
			st.close()
			ikeStates.Delete(d)
			return err
		}
		st.socks = append(st.socks, s)
	}
	for _, s := range st.socks {
		st.wg.Add(1)
		go st.read(s)
	}
	d.log.Info("IKE hand-off started", "ike_port", port, "natt_port", d.cfg.EncapPort)
	return nil
}

// StopIKE closes the IKE port's sockets and stops handing datagrams over.
func (d *Device) StopIKE() error {
	v, ok := ikeStates.LoadAndDelete(d)
	if !ok {
		return ErrIKEOff
	}
	return v.(*ikeState).close()
}

// IKEPorts returns the IKE port and the encapsulation (NAT-T) port; ike
// is 0 when the hand-off is not running.
func (d *Device) IKEPorts() (ike, natt uint16) {
	if v, ok := ikeStates.Load(d); ok {
		ike = v.(*ikeState).port
	}
	return ike, d.cfg.EncapPort
}

// IKEStats returns the hand-off's counters (zero when it is not running).
func (d *Device) IKEStats() IKEStats {
	v, ok := ikeStates.Load(d)
	if !ok {
		return IKEStats{}
	}
	st := v.(*ikeState)
	return IKEStats{
		Received: st.received.Load(), Sent: st.sent.Load(), SendErrors: st.sendErrors.Load(),
		Refused: st.refused.Load(), ReadErrors: st.readErrors.Load(),
	}
}

// handIKE passes a non-ESP-marked datagram received on the encapsulation
// port to the hand-off's handler, if it runs. payload is the UDP payload,
// marker included.
func (d *Device) handIKE(m *Message, payload []byte) {
	v, ok := ikeStates.Load(d)
	if !ok {
		return
	}
	st := v.(*ikeState)
	st.received.Add(1)
	st.handler(IKEPacket{Src: unmapPort(m.Src), Dst: unmapPort(m.Dst), Data: payload})
}

func unmapPort(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// SendIKE sends an IKE datagram from the IKE port or the encapsulation
// port, with the marked sockets, so that IKE never enters the TUN. From
// the encapsulation port only non-ESP-marked datagrams and NAT-keepalives
// are sent: the IKE daemon cannot inject ESP.
func (d *Device) SendIKE(p IKEPacket) error {
	v, ok := ikeStates.Load(d)
	if !ok {
		return ErrIKEOff
	}
	st := v.(*ikeState)
	err := st.send(p)
	switch {
	case err == nil:
		st.sent.Add(1)
	case errors.As(err, new(*refusal)):
		st.refused.Add(1)
	default:
		st.sendErrors.Add(1)
	}
	return err
}

// refusal is an IKE datagram SendIKE does not send.
type refusal struct{ msg string }

func (r *refusal) Error() string { return "dataplane: IKE hand-off: " + r.msg }

func refuse(format string, args ...any) error { return &refusal{fmt.Sprintf(format, args...)} }

func (st *ikeState) send(p IKEPacket) error {
	dst := p.Dst.Addr().Unmap()
	src := p.Src.Addr().Unmap()
	switch {
	case !dst.IsValid() || dst.IsUnspecified() || p.Dst.Port() == 0:
		return refuse("invalid destination %v", p.Dst)
	case src.IsValid() && src.Is4() != dst.Is4():
		return refuse("source %v and destination %v of different families", src, dst)
	case len(p.Data) == 0 || len(p.Data) > 65507:
		return refuse("datagram of %d bytes", len(p.Data))
	case dst.Is6() && st.d.cfg.NoIPv6:
		return refuse("IPv6 is off")
	}
	var oob []byte
	if src.IsValid() && !src.IsUnspecified() {
		if src.Is4() {
			oob = unix.PktInfo4(&unix.Inet4Pktinfo{Spec_dst: src.As4()})
		} else {
			oob = unix.PktInfo6(&unix.Inet6Pktinfo{Addr: src.As16()})
		}
	}
	switch p.Src.Port() {
	case st.port:
		for _, s := range st.socks {
			if (s.fam == unix.AF_INET) == dst.Is4() {
				_, _, err := s.conn.WriteMsgUDPAddrPort(p.Data, oob, netip.AddrPortFrom(dst, p.Dst.Port()))
				return err
			}
		}
		return refuse("no IKE socket for %v", dst)
	case st.d.cfg.EncapPort:
		if k := esp.ClassifyUDP(p.Data); k != esp.UDPIKE && k != esp.UDPKeepalive {
			return refuse("datagram from the encapsulation port without the non-ESP marker")
		}
		return st.sendEncapPort(p.Data, oob, dst, p.Dst.Port())
	}
	return refuse("source port %d is neither the IKE port %d nor the encapsulation port %d",
		p.Src.Port(), st.port, st.d.cfg.EncapPort)
}

// sendEncapPort sends from the data plane's own socket on the
// encapsulation port (the one that receives ESP-in-UDP).
func (st *ikeState) sendEncapPort(data, oob []byte, dst netip.Addr, port uint16) error {
	fam := unix.AF_INET
	var sa unix.Sockaddr
	if dst.Is4() {
		sa = &unix.SockaddrInet4{Port: int(port), Addr: dst.As4()}
	} else {
		fam = unix.AF_INET6
		sa = &unix.SockaddrInet6{Port: int(port), Addr: dst.As16()}
	}
	var rc syscall.RawConn
	for _, r := range st.d.io.Receivers {
		if u, ok := r.(*receiver); ok && u.udp && u.fam == fam {
			rc = u.c.rc
			break
		}
	}
	if rc == nil {
		return errIKENoUDPSock
	}
	var serr error
	err := rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), data, oob, sa, unix.MSG_DONTWAIT)
		return serr != unix.EAGAIN
	})
	if err != nil {
		return err
	}
	return serr
}

// read hands the datagrams of one IKE-port socket to the handler.
func (st *ikeState) read(s *ikeSocket) {
	defer st.wg.Done()
	buf := make([]byte, 65536)
	oob := make([]byte, 256)
	for {
		n, oobn, _, src, err := s.conn.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if st.closing.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			st.readErrors.Add(1)
			st.d.logf(logOuterRead, "IKE socket read failed", "err", err)
			continue
		}
		var dst netip.Addr
		var tos uint8
		parseControl(oob[:oobn], &dst, &tos)
		st.received.Add(1)
		st.handler(IKEPacket{Src: unmapPort(src), Dst: netip.AddrPortFrom(dst.Unmap(), st.port), Data: buf[:n]})
	}
}

func (st *ikeState) close() error {
	st.closing.Store(true)
	var errs []error
	for _, s := range st.socks {
		errs = append(errs, s.conn.Close())
	}
	st.wg.Wait()
	return errors.Join(errs...)
}

// openIKESocket opens a marked UDP socket on port that reports each
// datagram's destination address.
func openIKESocket(fam int, port uint16, mark uint32) (*ikeSocket, error) {
	what := fmt.Sprintf("%s UDP port %d (IKE)", famName(fam), port)
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return nil, fmt.Errorf("dataplane: %s socket: %w", what, err)
	}
	opts := []sockopt{{unix.SOL_SOCKET, unix.SO_MARK, int(mark)}}
	var sa unix.Sockaddr
	if fam == unix.AF_INET6 {
		opts = append(opts,
			sockopt{unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1},
			sockopt{unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1})
		sa = &unix.SockaddrInet6{Port: int(port)}
	} else {
		opts = append(opts, sockopt{unix.IPPROTO_IP, unix.IP_PKTINFO, 1})
		sa = &unix.SockaddrInet4{Port: int(port)}
	}
	if err := setsockopts(fd, what, opts...); err != nil {
		unix.Close(fd)
		return nil, err
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("dataplane: bind %s: %w", what, err)
	}
	f := os.NewFile(uintptr(fd), "ike-"+famName(fam))
	c, err := net.FilePacketConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("dataplane: %s: %w", what, err)
	}
	return &ikeSocket{fam: fam, conn: c.(*net.UDPConn)}, nil
}
