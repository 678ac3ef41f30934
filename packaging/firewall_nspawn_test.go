package packaging

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/internal/docblock"
	"github.com/espd/espd/testbed"
)

// TestFirewallUnderSystemd loads docs/deploy.md's section 8 firewall, as
// written, on both gateways of TestPackagesUnderSystemd's bed: each
// gateway's `nft firewall A` / `nft firewall B` block becomes its
// /etc/nftables.conf and the section's two command lines (`nft -c -f` and
// `systemctl enable --now nftables`) load it in the container, before
// section 6 brings the tunnel up through it (IKE and ESP negotiated and
// carried with input and forward at policy drop). The gateways' main tables
// route everything else across the transit link, as TestPackagesLifecycle's.
//
// It then checks: (a) pings pass both ways between the LAN hosts, IPv4 and
// IPv6; (b) 2 MB TCP transfers complete both ways in both families, and
// each handshake's MSS, captured on both LAN hosts' links, leaves the
// opener as the LAN MTU allows (1460, 1440) and reaches the far host
// clamped to the TUN's MTU less the IP and TCP headers (the SYN by the
// opener's gateway, the SYN-ACK by the other's: `rt mtu` on esp0); (c)
// with espd SIGKILLed on each gateway in turn (systemd restarts it) under
// ping traffic, the transit link, captured at both ends, carries not one
// cleartext frame of the LANs, and traffic passes again; (d) what the
// ruleset drops is dropped, where the same probe passed before the
// firewall was loaded: a TCP connection from gateway B to gateway A's port
// 22 (outside A's management prefix) times out, its SYN seen arriving on
// A's transit link and nothing sent back, while the client on LAN A (in
// the prefix) connects; and UDP from B's transit address to the client,
// sent to A's link-layer address, arrives on A's transit link and never on
// LAN A, not being from esp0.
func TestFirewallUnderSystemd(t *testing.T) {
	for _, rel := range debianReleases {
		t.Run("debian"+rel, func(t *testing.T) { firewallUnderSystemd(t, rel) })
	}
}

func firewallUnderSystemd(t *testing.T, release string) {
	bed := newPackageBed(t, "nspawnfw"+release, false, release)
	top := bed.top
	for name, peer := range map[string][2]netip.Prefix{"A": {testbed.GwBTransitV4, testbed.GwBTransitV6}, "B": {testbed.GwATransitV4, testbed.GwATransitV6}} {
		bed.node(name).MustIP(t, "-4", "route", "add", "default", "via", peer[0].Addr().String())
		bed.node(name).MustIP(t, "-6", "route", "add", "default", "via", peer[1].Addr().String())
	}
	ssh := listenTCP(t, top.GwA, 22)

	// (d)'s probes pass without the firewall: the listener answers from
	// the transit link, and A forwards the UDP to the client.
	for _, dst := range []netip.Addr{testbed.GwATransitV4.Addr(), testbed.GwATransitV6.Addr()} {
		if err := dialTCP(top.GwB, netip.AddrPortFrom(dst, 22), 5*time.Second); err != nil {
			t.Fatalf("without the firewall, gateway B cannot connect to %s port 22: %v", dst, err)
		}
	}
	for i, fam := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		if arrived, atA := forwardProbe(t, bed, fam, uint16(40000+i), 5*time.Second); !arrived || !atA {
			t.Fatalf("without the firewall, %v from B's transit address to the client: on A's link %v, on LAN A %v, want both", fam, atA, arrived)
		}
	}

	loadFirewall(t, bed)
	bed.section6(t)

	// (a) Both ways, both families.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, p := range []struct {
		from *testbed.Node
		to   netip.Prefix
	}{{top.Client, testbed.ServerV4}, {top.Client, testbed.ServerV6}, {top.Server, testbed.ClientV4}, {top.Server, testbed.ClientV6}} {
		if r, err := p.from.Ping(ctx, p.to.Addr(), testbed.PingOptions{Count: 3}); err != nil || !r.OK() {
			t.Errorf("with the firewall, ping from %s to %s: %v\n%s", p.from.Role, p.to.Addr(), err, r.Output)
		}
	}

	// (b) TCP through the tunnel, and its MSS.
	clampedTransfers(t, bed)

	// (c) espd killed on each gateway: no cleartext on the transit link.
	caps := newTransitCaptures(t, bed)
	dir := t.TempDir()
	pingers := []*pinger{
		startPinger(t, top.Client, dir, testbed.ServerV4.Addr()),
		startPinger(t, top.Client, dir, testbed.ServerV6.Addr()),
		startPinger(t, top.Server, dir, testbed.ClientV4.Addr()),
		startPinger(t, top.Server, dir, testbed.ClientV6.Addr()),
	}
	if !waitPassing(pingers, time.Now(), 30*time.Second) {
		t.Fatalf("with the firewall, no ping traffic both ways through the tunnel")
	}
	for _, gw := range []string{"A", "B"} {
		ev := &lifecycleEvent{name: "espd on " + gw + " SIGKILLed", start: time.Now()}
		ev.t0 = ev.start
		bed.killEspd(t, gw)
		bed.waitRecovered(t, ev, pingers)
		t.Logf("%s: traffic passes again %v after the kill", ev.name, ev.recovered.Sub(ev.start).Round(10*time.Millisecond))
	}
	esp := 0
	for _, r := range caps.stop(t) {
		t.Logf("transit link, %s", r.summary)
		for i, f := range r.res.Leaks(lanAddrs...) {
			if i < 10 {
				t.Errorf("cleartext on the transit link (%s): %s", r.side, f.String())
			}
		}
		if !r.res.Complete() {
			t.Errorf("capture %s incomplete: %d dropped, %d over the limit", r.side, r.res.Drops, r.res.Overflow)
		}
		esp += r.res.Counts()[testbed.ClassESP]
	}
	if esp == 0 {
		t.Errorf("the transit captures saw no ESP: they did not see the tunnel's traffic")
	}

	// (d) What the ruleset drops is dropped.
	wan, err := top.GwA.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 128})
	if err != nil {
		t.Fatal(err)
	}
	defer wan.Stop()
	for _, dst := range []netip.Addr{testbed.GwATransitV4.Addr(), testbed.GwATransitV6.Addr()} {
		before := ssh.accepted.Load()
		err := dialTCP(top.GwB, netip.AddrPortFrom(dst, 22), 3*time.Second)
		var ne net.Error
		if err == nil || !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("gateway B to %s port 22 through A's firewall: %v, want a time-out (dropped: no answer)", dst, err)
		}
		if n := ssh.accepted.Load() - before; n != 0 {
			t.Errorf("gateway A's listener accepted %d connections from B through the firewall", n)
		}
	}
	var syns, answers int
	for _, f := range wan.Frames() {
		if f.Proto == 6 && f.DstPort == 22 && !f.Outgoing {
			syns++
		}
		if f.Proto == 6 && f.SrcPort == 22 && f.Outgoing {
			answers++
		}
	}
	if syns == 0 || answers != 0 {
		t.Errorf("on A's transit link: %d TCP segments to port 22 came in, %d went back: want some, and none back", syns, answers)
	}
	for _, dst := range []netip.Addr{testbed.GwALANV4.Addr(), testbed.GwALANV6.Addr()} {
		if err := dialTCP(top.Client, netip.AddrPortFrom(dst, 22), 5*time.Second); err != nil {
			t.Errorf("the client on LAN A (management prefix) to %s port 22: %v, want connected", dst, err)
		}
	}
	for i, fam := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		arrived, atA := forwardProbe(t, bed, fam, uint16(40010+i), 3*time.Second)
		if !atA || arrived {
			t.Errorf("with the firewall, %v from B's transit address to the client: on A's link %v, on LAN A %v, want on A's link only", fam, atA, arrived)
		}
	}
}

// loadFirewall writes each gateway's block of docs/deploy.md's section 8
// (`nft firewall A`, `nft firewall B`) to its /etc/nftables.conf and runs
// the section's command lines as written, then checks that the ruleset is
// loaded with input and forward at policy drop and nftables.service is
// active and enabled.
func loadFirewall(t *testing.T, bed *packageBed) {
	t.Helper()
	blocks, err := docblock.Blocks("../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	load := markedBlock(t, "../docs/deploy.md", "sh", "load firewall")
	for _, want := range []string{"nft -c -f /etc/nftables.conf\n", "systemctl enable --now nftables\n"} {
		if !strings.Contains(load, want) {
			t.Fatalf("docs/deploy.md's `sh load firewall` block does not run %q:\n%s", want, load)
		}
	}
	for _, name := range []string{"A", "B"} {
		c := bed.gw[name]
		b := docblock.Marked(blocks, "firewall "+name)
		if len(b) != 1 || b[0].Lang != "nft" || !strings.HasPrefix(b[0].Section, "8.") {
			t.Fatalf("docs/deploy.md: want one `nft firewall %s` block in section 8, have %d", name, len(b))
		}
		if out, err := c.run([]byte(b[0].Text), "install", "-m", "0755", "/dev/stdin", "/etc/nftables.conf"); err != nil {
			t.Fatalf("gateway %s: writing /etc/nftables.conf: %v\n%s", name, err, out)
		}
		if out, err := c.run(nil, "sh", "-ec", load); err != nil {
			t.Fatalf("gateway %s: %s: %v\n%s", name, load, err, out)
		}
		for _, chain := range []string{"input", "forward"} {
			if out := c.must(t, "nft", "list", "chain", "inet", "gateway", chain); !strings.Contains(out, "policy drop;") {
				t.Fatalf("gateway %s: chain %s after loading the firewall:\n%s", name, chain, out)
			}
		}
		if p := c.show(t, "nftables.service", "ActiveState", "UnitFileState"); p["ActiveState"] != "active" || p["UnitFileState"] != "enabled" {
			t.Fatalf("gateway %s: nftables.service %v, want active and enabled", name, p)
		}
	}
	t.Logf("docs/deploy.md's firewall loaded on both gateways")
}

// clampedTransfers sends 2 MB over TCP each way between the LAN hosts in
// both families, with both hosts' links captured, and checks each
// handshake's MSS as TestFirewallUnderSystemd says.
func clampedTransfers(t *testing.T, bed *packageBed) {
	t.Helper()
	top := bed.top
	tunMTU := map[*testbed.Node]int{top.GwA: linkMTU(t, top.GwA, "esp0"), top.GwB: linkMTU(t, top.GwB, "esp0")}
	gwOf := map[*testbed.Node]*testbed.Node{top.Client: top.GwA, top.Server: top.GwB}
	caps := map[*testbed.Node]*testbed.Capture{}
	for _, n := range []*testbed.Node{top.Client, top.Server} {
		k, err := n.StartCapture(testbed.IfHost, testbed.CaptureOptions{Snaplen: 128})
		if err != nil {
			t.Fatal(err)
		}
		defer k.Stop()
		caps[n] = k
	}
	port := uint16(5200)
	for _, fam := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		hdr := testbed.Pick(fam, 40, 60)
		for _, dir := range [][2]*testbed.Node{{top.Client, top.Server}, {top.Server, top.Client}} {
			from, to := dir[0], dir[1]
			dst := testbed.Pick(fam, testbed.ServerV4, testbed.ServerV6).Addr()
			if to == top.Client {
				dst = testbed.Pick(fam, testbed.ClientV4, testbed.ClientV6).Addr()
			}
			port++
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			r, err := testbed.Transfer(ctx, testbed.TransferOptions{From: from, To: to, Dst: dst, Port: port, Bytes: 2 << 20, Seed: uint64(port)})
			cancel()
			if err != nil || r.Bytes != 2<<20 {
				t.Errorf("%v TCP %s -> %s through the tunnel: %v (%s)", fam, from.Role, to.Role, err, r)
				continue
			}
			// The SYN from the opener (from) and the SYN-ACK from the
			// listener (to), as each left and as each arrived.
			want := []struct {
				at       *testbed.Node
				syn, out bool
				mss      int
			}{
				{from, true, true, testbed.DefaultMTU - hdr},
				{to, true, false, tunMTU[gwOf[from]] - hdr},
				{to, false, true, testbed.DefaultMTU - hdr},
				{from, false, false, tunMTU[gwOf[to]] - hdr},
			}
			for _, w := range want {
				mss, ok := handshakeMSS(caps[w.at].Frames(), port, w.syn, w.out)
				what := map[bool]string{true: "SYN", false: "SYN-ACK"}[w.syn]
				if !ok {
					t.Errorf("%v %s -> %s port %d: no %s in %s's capture", fam, from.Role, to.Role, port, what, w.at.Role)
				} else if mss != w.mss {
					t.Errorf("%v %s -> %s port %d: the %s %s %s has MSS %d, want %d", fam, from.Role, to.Role, port, what,
						map[bool]string{true: "leaving", false: "reaching"}[w.out], w.at.Role, mss, w.mss)
				}
			}
			t.Logf("%v TCP %s -> %s: %s; MSS clamped to %d and %d", fam, from.Role, to.Role, r, tunMTU[gwOf[from]]-hdr, tunMTU[gwOf[to]]-hdr)
		}
	}
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

// tcpListener accepts TCP connections in a namespace and counts them.
type tcpListener struct {
	accepted atomic.Int64
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

// forwardProbe sends one UDP datagram (source port sport) of family fam
// from gateway B's transit address to the client on LAN A, out of B's
// transit link to gateway A's link-layer address, bypassing B's routing
// (and so espd): cleartext that A can only forward from the transit link.
// It reports whether it arrived on LAN A within wait, and whether A's
// transit link saw it come in.
func forwardProbe(t *testing.T, bed *packageBed, fam testbed.Family, sport uint16, wait time.Duration) (arrived, atA bool) {
	t.Helper()
	top := bed.top
	src := testbed.Pick(fam, testbed.GwBTransitV4, testbed.GwBTransitV6).Addr()
	dst := testbed.Pick(fam, testbed.ClientV4, testbed.ClientV6).Addr()
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
	lan, err := top.Client.StartCapture(testbed.IfHost, testbed.CaptureOptions{Snaplen: 128})
	if err != nil {
		t.Fatal(err)
	}
	defer lan.Stop()
	wan, err := top.GwA.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 128})
	if err != nil {
		t.Fatal(err)
	}
	defer wan.Stop()
	ethertype := uint16(testbed.Pick(fam, testbed.EtherTypeIPv4, testbed.EtherTypeIPv6))
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
	arrived = testbed.Poll(wait, 20*time.Millisecond, func() bool { return seen(lan) })
	return arrived, atA
}
