package packaging

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/testbed"
)

// The "internet" host of TestFirewallUnderSystemd: on the transit link,
// beyond gateway A's uplink, with no route back to LAN A's IPv4 (its
// replies reach the client only masqueraded) and the provider's route to
// LAN A's IPv6 prefix through gateway A.
var (
	internetV4 = netip.MustParsePrefix("198.18.0.9/24")
	internetV6 = netip.MustParsePrefix("2001:db8::9/64")
)

// internetPort is where the internet host listens for TCP.
const internetPort = 8080

// newInternetHost adds a namespace to bed on the transit link: a macvlan
// of gateway B's end of the link, so that gateway A reaches it on its
// uplink as it reaches B (B itself cannot: a macvlan does not talk to its
// lower device). It listens on internetPort until the test ends.
func newInternetHost(t *testing.T, bed *packageBed) (*testbed.Node, *tcpListener) {
	t.Helper()
	n := testbed.NewNodeT(t, "inet")
	bed.top.GwB.MustIP(t, "link", "add", "inet0", "link", testbed.IfTransit, "type", "macvlan", "mode", "bridge")
	bed.top.GwB.MustIP(t, "link", "set", "inet0", "netns", n.Name)
	n.MustIP(t, "link", "set", "inet0", "name", testbed.IfHost)
	n.MustIP(t, "addr", "add", internetV4.String(), "dev", testbed.IfHost)
	n.MustIP(t, "addr", "add", internetV6.String(), "dev", testbed.IfHost, "nodad")
	n.MustIP(t, "link", "set", testbed.IfHost, "up")
	n.MustIP(t, "-6", "route", "add", testbed.LANAV6.String(), "via", testbed.GwATransitV6.Addr().String())
	return n, listenTCP(t, n, internetPort)
}

// lanToInternet checks that the client on LAN A reaches the internet host
// in both families: a ping, and a TCP connection that the host sees come
// from gateway A's uplink address (IPv4, masqueraded) or from the client
// itself (IPv6, routed).
func lanToInternet(t *testing.T, bed *packageBed, inet *testbed.Node, ln *tcpListener, when string) {
	t.Helper()
	client := bed.top.Client
	for _, fam := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		dst := testbed.Pick(fam, internetV4, internetV6).Addr()
		want := testbed.Pick(fam, testbed.GwATransitV4, testbed.ClientV6).Addr()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		r, err := client.Ping(ctx, dst, testbed.PingOptions{Count: 3})
		cancel()
		if err != nil || !r.OK() {
			t.Errorf("%s: ping from the client to the internet host %s: %v\n%s", when, dst, err, r.Output)
		}
		before := ln.accepted.Load()
		if err := dialTCP(client, netip.AddrPortFrom(dst, internetPort), 10*time.Second); err != nil {
			t.Errorf("%s: TCP from the client to the internet host %s: %v", when, dst, err)
			continue
		}
		if !testbed.Poll(10*time.Second, 20*time.Millisecond, func() bool { return ln.accepted.Load() > before }) {
			t.Errorf("%s: the internet host accepted no connection from the client", when)
			continue
		}
		if got := ln.lastPeer(); got != want {
			t.Errorf("%s: %v TCP from the client reached the internet host from %v, want %v", when, fam, got, want)
		}
	}
}

// tcpListener accepts TCP connections in a namespace and counts them.
type tcpListener struct {
	accepted atomic.Int64
	mu       sync.Mutex
	peer     netip.Addr // of the last connection accepted
}

// lastPeer returns the source address of the last connection accepted.
func (l *tcpListener) lastPeer() netip.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.peer
}

// listenTCP listens on port (both families) in n until the test ends.
func listenTCP(t *testing.T, n *testbed.Node, port int) *tcpListener {
	t.Helper()
	var ln net.Listener
	if err := n.Do(func() (err error) {
		ln, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	l := &tcpListener{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if a, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
				l.mu.Lock()
				l.peer = a.Addr().Unmap()
				l.mu.Unlock()
			}
			l.accepted.Add(1)
			c.Close()
		}
	}()
	return l
}

// dialTCP connects from n to dst within timeout and closes the connection.
func dialTCP(n *testbed.Node, dst netip.AddrPort, timeout time.Duration) error {
	return n.Do(func() error {
		c, err := net.DialTimeout("tcp", dst.String(), timeout)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// spoofProbe sends one UDP datagram (source port sport) from src to dst,
// the client's or the server's address, out of gateway B's transit link to
// gateway A's link-layer address, bypassing B's routing and firewall (and
// so espd): a packet that A receives in clear on its uplink. It reports
// whether A's transit link saw it come in and whether it reached dst's
// host, each within wait.
func spoofProbe(t *testing.T, bed *packageBed, src, dst netip.Addr, sport uint16, wait time.Duration) (atA, arrived bool) {
	t.Helper()
	top := bed.top
	host := top.Client
	if dst == testbed.ServerV4.Addr() || dst == testbed.ServerV6.Addr() {
		host = top.Server
	}
	udp, err := testbed.BuildUDP(src, dst, sport, 9, []byte("espd firewall probe"))
	if err != nil {
		t.Fatal(err)
	}
	pkt, err := testbed.BuildIP(src, dst, 17, udp)
	if err != nil {
		t.Fatal(err)
	}
	var mac net.HardwareAddr
	if err := top.GwA.Do(func() error {
		ifi, err := net.InterfaceByName(testbed.IfTransit)
		if err == nil {
			mac = ifi.HardwareAddr
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	far, err := host.StartCapture(testbed.IfHost, testbed.CaptureOptions{Snaplen: 128})
	if err != nil {
		t.Fatal(err)
	}
	defer far.Stop()
	wan, err := top.GwA.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 128})
	if err != nil {
		t.Fatal(err)
	}
	defer wan.Stop()
	ethertype := uint16(testbed.EtherTypeIPv4)
	if src.Is6() {
		ethertype = testbed.EtherTypeIPv6
	}
	if err := top.GwB.Do(func() error {
		ifi, err := net.InterfaceByName(testbed.IfTransit)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		to := &unix.SockaddrLinklayer{Protocol: ethertype<<8 | ethertype>>8, Ifindex: ifi.Index, Halen: 6}
		copy(to.Addr[:], mac)
		return unix.Sendto(fd, pkt, 0, to)
	}); err != nil {
		t.Fatalf("sending the probe from gateway B: %v", err)
	}
	seen := func(k *testbed.Capture) bool {
		for _, f := range k.Frames() {
			if f.Proto == 17 && f.Src == src && f.Dst == dst && f.SrcPort == sport && !f.Outgoing {
				return true
			}
		}
		return false
	}
	atA = testbed.Poll(wait, 20*time.Millisecond, func() bool { return seen(wan) })
	arrived = testbed.Poll(wait, 20*time.Millisecond, func() bool { return seen(far) })
	return atA, arrived
}

// ownCleartext has gateway A ping dst once with the socket bound to its
// uplink (ping -I wan0), so that the echo request is routed out of the
// uplink in clear whatever espd's routes say, and reports whether A's
// transit link saw it leave.
func ownCleartext(t *testing.T, bed *packageBed, dst netip.Addr) bool {
	t.Helper()
	wan, err := bed.top.GwA.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 128})
	if err != nil {
		t.Fatal(err)
	}
	defer wan.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	bed.top.GwA.Run(ctx, "ping", "-c", "1", "-W", "1", "-I", testbed.IfTransit, dst.String()) // its answer does not matter
	return testbed.Poll(3*time.Second, 20*time.Millisecond, func() bool {
		for _, f := range wan.Frames() {
			if f.Dst == dst && f.Outgoing && (f.Proto == 1 || f.Proto == 58) {
				return true
			}
		}
		return false
	})
}

// handshakeMSS returns the MSS option of the first SYN (syn) or SYN-ACK
// (!syn) of the connection to or from port among frames that went out
// (out) or came in.
func handshakeMSS(frames []testbed.Frame, port uint16, syn, out bool) (int, bool) {
	for _, f := range frames {
		if f.Proto != 6 || f.Outgoing != out || (syn && f.DstPort != port) || (!syn && f.SrcPort != port) {
			continue
		}
		ihl := 40
		if f.Src.Is4() {
			ihl = int(f.Data[0]&0x0f) * 4
		}
		if len(f.Data) < ihl+20 {
			continue
		}
		tcp := f.Data[ihl:]
		flags := tcp[13] & 0x12 // SYN, ACK
		if (syn && flags != 0x02) || (!syn && flags != 0x12) {
			continue
		}
		opts := tcp[20:min(int(tcp[12]>>4)*4, len(tcp))]
		for i := 0; i < len(opts); {
			switch kind := opts[i]; {
			case kind == 0:
				return 0, false
			case kind == 1:
				i++
			case i+1 >= len(opts) || opts[i+1] < 2:
				return 0, false
			case kind == 2 && opts[i+1] == 4 && i+4 <= len(opts):
				return int(binary.BigEndian.Uint16(opts[i+2:])), true
			default:
				i += int(opts[i+1])
			}
		}
		return 0, false
	}
	return 0, false
}

// linkMTU returns the MTU of the node's interface ifname.
func linkMTU(t *testing.T, n *testbed.Node, ifname string) int {
	t.Helper()
	var mtu int
	if err := n.Do(func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err == nil {
			mtu = ifi.MTU
		}
		return err
	}); err != nil {
		t.Fatalf("%s: %v", n.Role, err)
	}
	return mtu
}

// strangerIKE sends an IKE_SA_INIT header (no payloads) from the internet
// host, a stranger to gateway A's tunnel, to A's UDP port 500 in each
// family, and reports for each whether charon on A logged a line naming
// the host's address within wait (espd relays IKE to charon, which logs
// every IKE packet it receives).
func strangerIKE(t *testing.T, bed *packageBed, inet *testbed.Node, wait time.Duration) map[testbed.Family]bool {
	t.Helper()
	c := bed.gw["A"]
	seen := map[testbed.Family]bool{}
	for i, fam := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		src := testbed.Pick(fam, internetV4, internetV6).Addr()
		dst := testbed.Pick(fam, testbed.GwATransitV4, testbed.GwATransitV6).Addr()
		mentions := func() int {
			out, _ := c.run(nil, "journalctl", "--no-pager", "-o", "cat", "-u", "strongswan")
			return testbed.CountLines(out, src.String()+"[")
		}
		before := mentions()
		hdr := make([]byte, 28)
		binary.BigEndian.PutUint64(hdr, 0x6573706466770000+uint64(i)+1) // the initiator's SPI
		hdr[17] = 0x20                                                  // version 2.0
		hdr[18] = 34                                                    // IKE_SA_INIT
		hdr[19] = 0x08                                                  // initiator
		binary.BigEndian.PutUint32(hdr[24:], uint32(len(hdr)))
		if err := inet.Do(func() error {
			conn, err := net.DialUDP("udp", &net.UDPAddr{IP: src.AsSlice(), Port: 500}, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 500)))
			if err != nil {
				return err
			}
			defer conn.Close()
			_, err = conn.Write(hdr)
			return err
		}); err != nil {
			t.Fatalf("sending IKE from the internet host: %v", err)
		}
		seen[fam] = testbed.Poll(wait, 100*time.Millisecond, func() bool { return mentions() > before })
	}
	return seen
}
