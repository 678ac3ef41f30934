package conn

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/esp"
)

// ikeRelay is a Sockets' IKE hand-off: the IKE port's sockets, the
// handler, and the counters. It lives in Sockets, so its life is the
// sockets' life: Close stops it.
type ikeRelay struct {
	s *Sockets

	mu      sync.Mutex // serialises start and stop
	running atomic.Pointer[ikeRun]

	received, sent, sendErrors, refused, readErrors atomic.Uint64
}

// ikeRun is one StartIKE..StopIKE span.
type ikeRun struct {
	port    uint16
	handler IKEHandler
	socks   []*ikeSocket
	wg      sync.WaitGroup
	closing atomic.Bool
}

// ikeSocket is one UDP socket on the IKE port.
type ikeSocket struct {
	fam  int
	conn *net.UDPConn
}

func (r *ikeRelay) init(s *Sockets) { r.s = s }

// StartIKE implements IKE.
func (s *Sockets) StartIKE(port uint16, h IKEHandler) error { return s.ike.start(port, h) }

// StopIKE implements IKE.
func (s *Sockets) StopIKE() error { return s.ike.stop() }

// DeliverIKE implements IKE.
func (s *Sockets) DeliverIKE(p IKEPacket) { s.ike.deliver(p) }

// SendIKE implements IKE.
func (s *Sockets) SendIKE(p IKEPacket) error { return s.ike.sendCounted(p) }

// IKEPorts implements IKE.
func (s *Sockets) IKEPorts() (ike, natt uint16) {
	if run := s.ike.running.Load(); run != nil {
		ike = run.port
	}
	return ike, s.cfg.EncapPort
}

// IKEStats implements IKE.
func (s *Sockets) IKEStats() IKEStats {
	r := &s.ike
	return IKEStats{
		Received: r.received.Load(), Sent: r.sent.Load(), SendErrors: r.sendErrors.Load(),
		Refused: r.refused.Load(), ReadErrors: r.readErrors.Load(),
	}
}

func (r *ikeRelay) start(port uint16, h IKEHandler) error {
	if h == nil {
		return errors.New("conn: StartIKE without a handler")
	}
	if port == 0 {
		port = DefaultIKEPort
	}
	if port == r.s.cfg.EncapPort {
		return fmt.Errorf("conn: IKE port %d is the encapsulation port", port)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running.Load() != nil {
		return ErrIKERunning
	}
	run := &ikeRun{port: port, handler: h}
	fams := []int{unix.AF_INET}
	if !r.s.cfg.NoIPv6 {
		fams = append(fams, unix.AF_INET6)
	}
	for _, fam := range fams {
		sk, err := openIKESocket(fam, port, r.s.cfg.Mark)
		if err != nil {
			run.close()
			return err
		}
		run.socks = append(run.socks, sk)
	}
	for _, sk := range run.socks {
		run.wg.Add(1)
		go r.read(run, sk)
	}
	r.running.Store(run)
	return nil
}

func (r *ikeRelay) stop() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	run := r.running.Swap(nil)
	if run == nil {
		return ErrIKEOff
	}
	return run.close()
}

// deliver hands p to the running hand-off's handler.
func (r *ikeRelay) deliver(p IKEPacket) {
	run := r.running.Load()
	if run == nil {
		return
	}
	r.received.Add(1)
	run.handler(IKEPacket{Src: unmapPort(p.Src), Dst: unmapPort(p.Dst), Data: p.Data})
}

func unmapPort(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// sendCounted sends p and counts the outcome.
func (r *ikeRelay) sendCounted(p IKEPacket) error {
	run := r.running.Load()
	if run == nil {
		return ErrIKEOff
	}
	err := r.send(run, p)
	switch {
	case err == nil:
		r.sent.Add(1)
	case errors.As(err, new(*IKERefusal)):
		r.refused.Add(1)
	default:
		r.sendErrors.Add(1)
	}
	return err
}

func refuse(format string, args ...any) error {
	return &IKERefusal{Reason: fmt.Sprintf(format, args...)}
}

func (r *ikeRelay) send(run *ikeRun, p IKEPacket) error {
	dst := p.Dst.Addr().Unmap()
	src := p.Src.Addr().Unmap()
	switch {
	case !dst.IsValid() || dst.IsUnspecified() || p.Dst.Port() == 0:
		return refuse("invalid destination %v", p.Dst)
	case src.IsValid() && src.Is4() != dst.Is4():
		return refuse("source %v and destination %v of different families", src, dst)
	case len(p.Data) == 0 || len(p.Data) > 65507:
		return refuse("datagram of %d bytes", len(p.Data))
	case dst.Is6() && r.s.cfg.NoIPv6:
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
	case run.port:
		for _, sk := range run.socks {
			if (sk.fam == unix.AF_INET) == dst.Is4() {
				_, _, err := sk.conn.WriteMsgUDPAddrPort(p.Data, oob, netip.AddrPortFrom(dst, p.Dst.Port()))
				return err
			}
		}
		return refuse("no IKE socket for %v", dst)
	case r.s.cfg.EncapPort:
		if k := esp.ClassifyUDP(p.Data); k != esp.UDPIKE && k != esp.UDPKeepalive {
			return refuse("datagram from the encapsulation port without the non-ESP marker")
		}
		return r.sendEncapPort(p.Data, oob, dst, p.Dst.Port())
	}
	return refuse("source port %d is neither the IKE port %d nor the encapsulation port %d",
		p.Src.Port(), run.port, r.s.cfg.EncapPort)
}

// sendEncapPort sends from the socket on the encapsulation port that
// receives ESP-in-UDP.
func (r *ikeRelay) sendEncapPort(data, oob []byte, dst netip.Addr, port uint16) error {
	var u *receiver
	var sa unix.Sockaddr
	if dst.Is4() {
		u, sa = r.s.udp[0], &unix.SockaddrInet4{Port: int(port), Addr: dst.As4()}
	} else {
		u, sa = r.s.udp[1], &unix.SockaddrInet6{Port: int(port), Addr: dst.As16()}
	}
	if u == nil {
		return refuse("no socket on the encapsulation port for %v", dst)
	}
	var serr error
	err := u.c.rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), data, oob, sa, unix.MSG_DONTWAIT)
		return serr != unix.EAGAIN
	})
	if err != nil {
		return err
	}
	return serr
}

// maxReadBackoff is the longest an IKE port's reader waits after a read
// error before it reads again (the wait doubles from 1 ms with each error
// in a row and starts again after a datagram).
const maxReadBackoff = 100 * time.Millisecond

// read hands the datagrams of one IKE-port socket to the handler.
func (r *ikeRelay) read(run *ikeRun, sk *ikeSocket) {
	defer run.wg.Done()
	buf := make([]byte, 65536)
	oob := make([]byte, 256)
	var backoff time.Duration
	for {
		n, oobn, _, src, err := sk.conn.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if run.closing.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			r.readErrors.Add(1)
			// An error that persists must not spin a core: wait a little
			// longer after each one in a row, up to maxReadBackoff.
			backoff = min(max(2*backoff, time.Millisecond), maxReadBackoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		var dst netip.Addr
		var tos uint8
		parseControl(oob[:oobn], &dst, &tos)
		r.received.Add(1)
		run.handler(IKEPacket{Src: unmapPort(src), Dst: netip.AddrPortFrom(dst.Unmap(), run.port), Data: buf[:n]})
	}
}

func (run *ikeRun) close() error {
	run.closing.Store(true)
	var errs []error
	for _, sk := range run.socks {
		errs = append(errs, sk.conn.Close())
	}
	run.wg.Wait()
	return errors.Join(errs...)
}

// openIKESocket opens a marked UDP socket on port that reports each
// datagram's destination address.
func openIKESocket(fam int, port uint16, mark uint32) (*ikeSocket, error) {
	what := fmt.Sprintf("%s UDP port %d (IKE)", famName(fam), port)
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return nil, fmt.Errorf("conn: %s socket: %w", what, err)
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
	if err := setAndBind(fd, what, sa, opts); err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "ike-"+famName(fam))
	c, err := net.FilePacketConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("conn: %s: %w", what, err)
	}
	return &ikeSocket{fam: fam, conn: c.(*net.UDPConn)}, nil
}
