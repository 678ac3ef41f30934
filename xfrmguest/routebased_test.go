package xfrmguest_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// rbTunnel is one route-based tunnel of TestRouteBasedXFRMInterface: the
// interface's name (the same on both sides) and ID, the outer family, and
// each side's inner addresses (put on its interface; the other side routes
// the networks around them, /24 and /64, into its own).
type rbTunnel struct {
	name            string
	ifID            int
	outer6          bool
	espdI4, guestI4 netip.Addr
	espdI6, guestI6 netip.Addr
	// p4 and p6 are the tunnel's states, with its IPv4 and its IPv6
	// inner addresses.
	p4, p6 *pair
}

// TestRouteBasedXFRMInterface runs, on a guest of its own of each kernel
// (subtests linux6.1 and linux6.12), route-based tunnels between espd and
// Linux's own XFRM interfaces: ipsec7 (if_id 7)
// over IPv4 (198.18.0.1 - 198.18.0.2) and ipsec8 (if_id 8) over IPv6
// (2001:db8::1 - 2001:db8::2), each carrying IPv4 and IPv6. espd, keyed by
// its configuration file, holds both interfaces ([[interface]]), for each
// an outbound and an inbound state of its if_id (aes128gcm16, raw ESP, no
// selectors) and out and in policies of its if_id for 0.0.0.0/0 and ::/0.
// The guest loads xfrm_interface and holds both interfaces (ip link add
// ... type xfrm dev eth0 if_id N), the same states with their if_id (flag
// af-unspec: one pair carries both inner families, as a 0/0 and ::/0
// CHILD_SA's does) and out, in and fwd policies of each if_id for
// 0.0.0.0/0 and ::/0. No selector names an inner network: each side puts
// its inner addresses on its interfaces and routes the other side's inner
// networks into them. The outer addresses, routed into no interface,
// still reach each other in clear on both sides, untouched by the 0/0
// policies. Then pings cross each tunnel both ways, IPv4 and IPv6 inside:
// each state counted exactly the pings routed into its interface, alike on
// both ends (espctl, ip -s xfrm state), the guest's XFRM error counters
// did not move, espd dropped nothing on the tunnels' states, and the
// capture of the link shows nothing but the tunnels' ESP and link
// housekeeping between the outer addresses and no inner address in clear.
func TestRouteBasedXFRMInterface(t *testing.T) { eachKernel(t, routeBased) }

func routeBased(t *testing.T, series string) {
	node, g := bootT(t, series, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	l := &lab{node: node, g: g, dir: dir, sock: filepath.Join(dir, "espd.sock"), spi: 0x70000, nullSPIs: map[uint32]bool{}}
	a := netip.MustParseAddr
	tunnels := []*rbTunnel{
		{name: "ipsec7", ifID: 7, espdI4: espdInner4, guestI4: guestInner4, espdI6: espdInner6, guestI6: guestInner6},
		{name: "ipsec8", ifID: 8, outer6: true, espdI4: a("198.18.4.1"), guestI4: a("198.18.5.1"),
			espdI6: a("2001:db8:4::1"), guestI6: a("2001:db8:5::1")},
	}
	var inner []netip.Addr
	for _, tu := range tunnels {
		tu.p4 = l.newPair(t, "aes128gcm16", tu.outer6, false, false)
		tu.p4.espdI, tu.p4.guestI = tu.espdI4, tu.guestI4
		p6 := *tu.p4
		p6.espdI, p6.guestI = tu.espdI6, tu.guestI6
		tu.p6 = &p6
		inner = append(inner, tu.espdI4, tu.guestI4, tu.espdI6, tu.guestI6)
	}
	// innerNet returns the network around a that the other side routes
	// into the tunnel's interface.
	innerNet := func(a netip.Addr) string {
		return netip.PrefixFrom(a, testbed.Pick(family(a.Is6()), 24, 64)).Masked().String()
	}

	// espd's side: the configuration file, with key files.
	var conf strings.Builder
	conf.WriteString("# written by TestRouteBasedXFRMInterface\n")
	for _, tu := range tunnels {
		p := tu.p4
		fmt.Fprintf(&conf, "\n[[interface]]\nname = %q\nif_id = %d\n", tu.name, tu.ifID)
		for _, s := range []struct {
			spi      uint32
			dir      string
			src, dst netip.Addr
			k        keys
		}{{p.out, "out", p.espdO, p.guestO, p.kOut}, {p.in, "in", p.guestO, p.espdO, p.kIn}} {
			fmt.Fprintf(&conf, "\n[[sa]]\nspi = 0x%x\ndir = %q\nsrc = %q\ndst = %q\nsuite = %q\nenc_key_file = %q\nreqid = %d\nif_id = %d\n",
				s.spi, s.dir, s.src, s.dst, p.suite.String(), l.keyFile(t, s.k.enc), p.reqid, tu.ifID)
		}
		for _, sel := range []string{"0.0.0.0/0", "::/0"} {
			for _, d := range []string{"out", "in"} {
				fmt.Fprintf(&conf, "\n[[policy]]\nsrc = %q\ndst = %q\ndir = %q\nreqid = %d\nif_id = %d\n", sel, sel, d, p.reqid, tu.ifID)
			}
		}
	}
	confPath := filepath.Join(dir, "espd.toml")
	if err := os.WriteFile(confPath, []byte(conf.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	// Neither kernel solicits routers on the interfaces (a TUN device and
	// an XFRM interface both get an IPv6 link-local address, and with it
	// router solicitations to ff02::2 for the next seconds, which a ::/0
	// policy carries): the states count the pings and nothing else, and
	// no solicitation reaches a side before its states exist.
	if out, err := node.Run(ctx, "sysctl", "-w", "net.ipv6.conf.default.router_solicitations=0"); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	proc, err := node.Start(filepath.Join(dir, "espd.log"), espdBin, "--config", confPath, "--tun", "esp0", "--socket", l.sock,
		"--state-dir", filepath.Join(dir, "state"), "--workers", "1", "--log-format", "text")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("espd's configuration:\n%s\nespd logged:\n%s", conf.String(), testbed.Tail(proc.Log(), 40))
		}
	})
	if err := testbed.WaitEspd(ctx, node, proc, l.sock, "esp0"); err != nil {
		t.Fatalf("%v\n%s", err, proc.Log())
	}
	l.espd = proc
	for _, tu := range tunnels {
		if !testbed.Poll(10*time.Second, 50*time.Millisecond, func() bool {
			_, err := node.IP(ctx, "link", "show", "dev", tu.name)
			return err == nil
		}) {
			t.Fatalf("espd did not create %s", tu.name)
		}
		node.MustIP(t, "link", "set", tu.name, "up")
		node.MustIP(t, "addr", "add", hostPrefix(tu.espdI4), "dev", tu.name)
		node.MustIP(t, "addr", "add", hostPrefix(tu.espdI6), "dev", tu.name, "nodad")
		node.MustIP(t, "route", "add", innerNet(tu.guestI4), "dev", tu.name, "src", tu.espdI4.String())
		node.MustIP(t, "-6", "route", "add", innerNet(tu.guestI6), "dev", tu.name, "src", tu.espdI6.String())
	}

	// The guest's side: its XFRM interfaces, states and policies.
	cmds := []string{
		"grep -q '^xfrm_interface ' /proc/modules || modprobe xfrm_interface",
		"echo 0 >/proc/sys/net/ipv6/conf/default/router_solicitations",
	}
	for _, tu := range tunnels {
		p := tu.p4
		state := func(spi uint32, src, dst netip.Addr, k keys) string {
			algo, err := kernelAlgo(p.suite, k)
			if err != nil {
				t.Fatal(err)
			}
			return fmt.Sprintf("ip xfrm state add src %s dst %s proto esp spi 0x%x reqid %d mode tunnel %s replay-window 32 flag af-unspec if_id %d",
				src, dst, spi, p.reqid, algo, tu.ifID)
		}
		policy := func(sel, dir string, src, dst netip.Addr) string {
			return fmt.Sprintf("ip xfrm policy add src %s dst %s dir %s if_id %d tmpl src %s dst %s proto esp reqid %d mode tunnel",
				sel, sel, dir, tu.ifID, src, dst, p.reqid)
		}
		cmds = append(cmds,
			fmt.Sprintf("ip link add %s type xfrm dev eth0 if_id %d", tu.name, tu.ifID),
			"ip link set "+tu.name+" up",
			state(p.out, p.espdO, p.guestO, p.kOut),
			state(p.in, p.guestO, p.espdO, p.kIn))
		for _, sel := range []string{"0.0.0.0/0", "::/0"} {
			cmds = append(cmds, policy(sel, "out", p.guestO, p.espdO), policy(sel, "in", p.espdO, p.guestO), policy(sel, "fwd", p.espdO, p.guestO))
		}
		cmds = append(cmds,
			"ip addr add "+hostPrefix(tu.guestI4)+" dev "+tu.name,
			"ip addr add "+hostPrefix(tu.guestI6)+" dev "+tu.name+" nodad",
			"ip route add "+innerNet(tu.espdI4)+" dev "+tu.name+" src "+tu.guestI4.String(),
			"ip -6 route add "+innerNet(tu.espdI6)+" dev "+tu.name+" src "+tu.guestI6.String())
	}
	l.guest(t, ctx, cmds...)
	for _, tu := range tunnels {
		if out, err := g.MustRun(ctx, "ip -d link show "+tu.name); err != nil || !strings.Contains(out, fmt.Sprintf("if_id %#x", tu.ifID)) {
			t.Fatalf("the guest's %s is not an XFRM interface of if_id %d (%v):\n%s", tu.name, tu.ifID, err, out)
		}
	}

	// Route-based on both sides: the 0/0 policies leave alone what is
	// not routed into an interface, here the outer addresses' own pings.
	counts := func() [8]int {
		var c [8]int
		for i, tu := range tunnels {
			e, gu := l.rbCounts(t, ctx, tu.p4)
			c[4*i], c[4*i+1], c[4*i+2], c[4*i+3] = e[0], e[1], gu[0], gu[1]
		}
		return c
	}
	before := counts()
	for _, f := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		espdO, guestO := testbed.Pick(f, espdOuter4, espdOuter6), testbed.Pick(f, guestOuter4, guestOuter6)
		if r, err := node.Ping(ctx, guestO, testbed.PingOptions{Count: 2, Wait: 10 * time.Second}); err != nil || !r.OK() {
			t.Errorf("espd's side does not reach the guest's outer address %s in clear: %v\n%s", guestO, err, r.Output)
		}
		if out, _, err := g.Run(ctx, fmt.Sprintf("ping -%c -c 2 -W 10 %s", testbed.Pick(f, '4', '6'), espdO)); err != nil || !pingAllAnswered(out, 2) {
			t.Errorf("the guest does not reach espd's outer address %s in clear (%v):\n%s", espdO, err, out)
		}
	}
	if after := counts(); after != before {
		t.Errorf("the outer addresses' pings moved the tunnels' states: packets (espd out, espd in, guest in, guest out per tunnel) %v, then %v", before, after)
	}

	c, err := node.StartCapture("tap0", testbed.CaptureOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.cap = c
	xfrmBefore := l.xfrmStat(t, ctx)
	// n pings each way and family through each tunnel: 4n packets each
	// way on each tunnel's states (requests and replies), and those of one
	// tunnel only on its states.
	const n = 3
	for i, tu := range tunnels {
		t.Run(tu.name, func(t *testing.T) {
			for _, q := range []*pair{tu.p4, tu.p6} {
				l.pingFromEspd(t, ctx, q, n)
			}
			l.checkRouteBasedCounts(t, ctx, tu.p4, 2*n)
			for _, q := range []*pair{tu.p4, tu.p6} {
				l.pingFromGuest(t, ctx, q, n, "")
			}
			l.checkRouteBasedCounts(t, ctx, tu.p4, 4*n)
			for _, other := range tunnels[:i] {
				l.checkRouteBasedCounts(t, ctx, other.p4, 4*n)
			}
			for _, other := range tunnels[i+1:] {
				l.checkRouteBasedCounts(t, ctx, other.p4, 0)
			}
			l.checkNoErrors(t, ctx, tu.p4, xfrmBefore)
		})
	}
	if t.Failed() {
		t.Logf("espd:\n%s", l.espctl(t, "sa", "list"))
		out, _, _ := g.Run(ctx, "ip -s xfrm state; cat /proc/net/xfrm_stat")
		t.Logf("guest:\n%s", out)
	}

	res, err := c.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("capture on tap0: %s", res.Summary())
	if !res.Complete() {
		t.Errorf("the capture is incomplete: %s", res.Summary())
	}
	outer := map[netip.Addr]bool{espdOuter4: true, guestOuter4: true, espdOuter6: true, guestOuter6: true}
	spis := map[uint32]bool{}
	for _, tu := range tunnels {
		spis[tu.p4.out], spis[tu.p4.in] = true, true
	}
	esp := 0
	for i := range res.Frames {
		f := &res.Frames[i]
		switch {
		case f.Class == testbed.ClassESP && spis[f.SPI]:
			esp++
		case f.Class == testbed.ClassLink:
		case outer[f.Src] && outer[f.Dst]:
			t.Errorf("a frame between the outer addresses is not the tunnels' ESP: %s", f)
		}
	}
	if want := 8 * n * len(tunnels); esp < want {
		t.Errorf("the capture holds %d ESP frames of the tunnels' SPIs, want at least %d", esp, want)
	}
	for _, f := range res.Leaks(inner...) {
		t.Errorf("a frame shows an inner address in clear: %s", &f)
	}
}

// pingAllAnswered reports whether ping's output says all of n echo
// requests were answered.
func pingAllAnswered(out string, n int) bool {
	m := pingSummary.FindStringSubmatch(out)
	return m != nil && m[1] == fmt.Sprint(n) && m[2] == m[1]
}

// rbCounts returns the packets counted on the pair's states: espd's
// (out, in) and the guest's (in, out), each pair in the order of the
// packets' direction (espd -> guest, guest -> espd).
func (l *lab) rbCounts(t *testing.T, ctx context.Context, p *pair) (espd, guest [2]int) {
	t.Helper()
	espd = [2]int{int(l.espdSA(t, p.out, p.guestO).Stats.Packets), int(l.espdSA(t, p.in, p.espdO).Stats.Packets)}
	guest = [2]int{packets(l.guestShowState(t, ctx, p.out, p.espdO, p.guestO)), packets(l.guestShowState(t, ctx, p.in, p.guestO, p.espdO))}
	return espd, guest
}

// checkRouteBasedCounts checks that each of the pair's states counted
// exactly want packets on both ends, waiting up to 10 s for the counts to
// settle.
func (l *lab) checkRouteBasedCounts(t *testing.T, ctx context.Context, p *pair, want int) {
	t.Helper()
	var e, g [2]int
	testbed.Poll(10*time.Second, 200*time.Millisecond, func() bool {
		e, g = l.rbCounts(t, ctx, p)
		return e == [2]int{want, want} && g == e
	})
	if e[0] != want || g[0] != want {
		t.Errorf("espd -> guest on %s: espd sent %d packets, the guest received %d, want %d", p.guestO, e[0], g[0], want)
	}
	if e[1] != want || g[1] != want {
		t.Errorf("guest -> espd on %s: the guest sent %d packets, espd received %d, want %d", p.guestO, g[1], e[1], want)
	}
}
