package packaging

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// firewallDoc is the page TestFirewallUnderSystemd runs.
const firewallDoc = "../docs/firewall.md"

// TestFirewallUnderSystemd runs docs/firewall.md as written on both
// gateways of TestPackagesUnderSystemd's bed, with an internet host on the
// transit link beyond gateway A's uplink (newInternetHost). The page's box
// ruleset (input and forward at policy drop, masquerade) becomes each
// gateway's /etc/nftables.conf and its load block runs; then the client
// must reach the internet host (masqueraded for IPv4). Then each gateway's
// espd table goes to /etc/nftables.d/espd.nft, beside it, with the page's
// load block, and section 6 of docs/deploy.md brings the tunnel up through
// both. The gateways' main tables route everything else across the
// transit link, as TestPackagesLifecycle's.
//
// It then checks: (a) pings both ways between the LAN hosts, IPv4 and
// IPv6; (b) 2 MB TCP transfers both ways in both families, each
// handshake's MSS leaving the opener as the LAN MTU allows (1460, 1440) and
// reaching the far host clamped to the TUN's MTU less the headers (`rt
// mtu` on esp0); LAN A to the internet still, and SSH from LAN A to gateway
// A; (c) with espd SIGKILLed on each gateway in turn under ping traffic,
// not one cleartext frame of the LANs on the transit link, captured at both
// ends; (d) the drops, of probes that passed before: TCP from gateway B to
// A's port 22 (the box's input), UDP from B's transit address to the
// client (the box's forward), and, espd's table's own, UDP to the client
// from the server's address but not out of the tunnel, UDP to the server
// from a made-up LAN A address that arrived on the uplink, and gateway A's
// own ping to the server bound to its uplink; (e) both tables, and the
// tunnel, are there after `systemctl restart nftables`; (f) on gateway A,
// the page's removal block leaves the box's tables loading, and espd's
// table beside Debian's default ruleset (every chain accepts) drops what
// (d) says is its own, and IKE from a host not its peer, which pass
// without it, while the tunnel passes.
func TestFirewallUnderSystemd(t *testing.T) {
	for _, rel := range debianReleases {
		t.Run("debian"+rel, func(t *testing.T) { firewallUnderSystemd(t, rel) })
	}
}

// The made-up LAN A addresses of (d)'s probe into the tunnel.
var (
	spoofLANAV4 = netip.MustParseAddr("198.18.1.77")
	spoofLANAV6 = netip.MustParseAddr("2001:db8:1::77")
)

func firewallUnderSystemd(t *testing.T, release string) {
	bed := newPackageBed(t, "nspawnfw"+release, false, release)
	top := bed.top
	for name, peer := range map[string][2]netip.Prefix{"A": {testbed.GwBTransitV4, testbed.GwBTransitV6}, "B": {testbed.GwATransitV4, testbed.GwATransitV6}} {
		bed.node(name).MustIP(t, "-4", "route", "add", "default", "via", peer[0].Addr().String())
		bed.node(name).MustIP(t, "-6", "route", "add", "default", "via", peer[1].Addr().String())
	}
	inet, web := newInternetHost(t, bed)
	ssh := listenTCP(t, top.GwA, 22)
	debianConf := bed.gw["A"].must(t, "cat", "/etc/nftables.conf")

	// (d)'s first probes pass without a firewall: the listener answers
	// from the transit link, and A forwards the UDP to the client.
	for _, dst := range []netip.Addr{testbed.GwATransitV4.Addr(), testbed.GwATransitV6.Addr()} {
		if err := dialTCP(top.GwB, netip.AddrPortFrom(dst, 22), 5*time.Second); err != nil {
			t.Fatalf("without a firewall, gateway B cannot connect to %s port 22: %v", dst, err)
		}
	}
	for i, fam := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		src, dst := testbed.Pick(fam, testbed.GwBTransitV4, testbed.GwBTransitV6).Addr(), testbed.Pick(fam, testbed.ClientV4, testbed.ClientV6).Addr()
		if atA, arrived := spoofProbe(t, bed, src, dst, uint16(40000+i), 5*time.Second); !atA || !arrived {
			t.Fatalf("without a firewall, UDP from %s to %s: on A's link %v, arrived %v, want both", src, dst, atA, arrived)
		}
	}

	loadBoxRuleset(t, bed)
	lanToInternet(t, bed, inet, web, "with the box's own firewall")
	for _, name := range []string{"A", "B"} {
		loadEspdTable(t, bed, name)
		checkTables(t, bed, name, true, "drop")
	}
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

	// (b) TCP through the tunnel, and its MSS; the internet; management.
	clampedTransfers(t, bed)
	lanToInternet(t, bed, inet, web, "beside espd's table, the tunnel up")
	for _, dst := range []netip.Addr{testbed.GwALANV4.Addr(), testbed.GwALANV6.Addr()} {
		if err := dialTCP(top.Client, netip.AddrPortFrom(dst, 22), 5*time.Second); err != nil {
			t.Errorf("the client on LAN A to %s port 22 (SSH from the LAN): %v, want connected", dst, err)
		}
	}

	// (c) espd killed on each gateway: no cleartext on the transit link.
	killedUnderFirewall(t, bed)

	// (d) What the rulesets drop is dropped.
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
	for i, fam := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		src, dst := testbed.Pick(fam, testbed.GwBTransitV4, testbed.GwBTransitV6).Addr(), testbed.Pick(fam, testbed.ClientV4, testbed.ClientV6).Addr()
		if atA, arrived := spoofProbe(t, bed, src, dst, uint16(40010+i), 3*time.Second); !atA || arrived {
			t.Errorf("with the firewall, UDP from %s to %s: on A's link %v, arrived %v, want on A's link only", src, dst, atA, arrived)
		}
	}
	espdTableDrops(t, bed, 40020, true)

	// (e) Both tables survive a restart of nftables.service.
	for _, name := range []string{"A", "B"} {
		bed.gw[name].must(t, "systemctl", "restart", "nftables")
		checkTables(t, bed, name, true, "drop")
	}
	tunnelPings(t, bed, "after systemctl restart nftables")

	// (f) Removed, and beside Debian's default ruleset.
	besideDefaultRuleset(t, bed, inet, debianConf)
}

// espdTableDrops checks what espd's table drops of its own, gateway A's,
// with probes from source port sport on: UDP to the client from the
// server's address arriving on A's uplink, UDP to the server from a
// made-up LAN A address arriving there, and A's own ping to the server
// bound to its uplink. With want false it checks that each passes instead
// (without espd's table, beside a ruleset that accepts everything).
func espdTableDrops(t *testing.T, bed *packageBed, sport uint16, want bool) {
	t.Helper()
	verb := map[bool]string{true: "dropped", false: "passing"}[want]
	for _, fam := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		server := testbed.Pick(fam, testbed.ServerV4, testbed.ServerV6).Addr()
		client := testbed.Pick(fam, testbed.ClientV4, testbed.ClientV6).Addr()
		spoof := testbed.Pick(fam, spoofLANAV4, spoofLANAV6)
		for _, p := range [][2]netip.Addr{{server, client}, {spoof, server}} {
			sport++
			atA, arrived := spoofProbe(t, bed, p[0], p[1], sport, 3*time.Second)
			if !atA || arrived == want {
				t.Errorf("UDP from %s to %s, in clear on A's uplink: on A's link %v, arrived %v, want it %s", p[0], p[1], atA, arrived, verb)
			}
		}
		if left := ownCleartext(t, bed, server); left == want {
			t.Errorf("gateway A's ping to %s bound to its uplink: left on it %v, want it %s", server, left, verb)
		}
	}
}

// killedUnderFirewall kills espd on each gateway in turn under ping
// traffic and checks that the transit link, captured at both ends, carries
// not one cleartext frame of the LANs, and that traffic passes again.
func killedUnderFirewall(t *testing.T, bed *packageBed) {
	t.Helper()
	top := bed.top
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
}

// tunnelPings pings both ways between the LAN hosts in both families.
func tunnelPings(t *testing.T, bed *packageBed, when string) {
	t.Helper()
	top := bed.top
	for _, p := range [][2]*testbed.Node{{top.Client, top.Server}, {top.Server, top.Client}} {
		for _, fam := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
			dst := testbed.Pick(fam, testbed.ServerV4, testbed.ServerV6).Addr()
			if p[1] == top.Client {
				dst = testbed.Pick(fam, testbed.ClientV4, testbed.ClientV6).Addr()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			r, err := p[0].Ping(ctx, dst, testbed.PingOptions{Count: 3})
			cancel()
			if err != nil || !r.OK() {
				t.Errorf("%s: ping from %s to %s: %v\n%s", when, p[0].Role, dst, err, r.Output)
			}
		}
	}
}

// besideDefaultRuleset runs the page's removal block on gateway A and
// checks that the box's tables stay and load again; then gives A Debian's
// default ruleset (debianConf: every chain accepts), checks that what
// espd's table drops passes without it (and IKE from the internet host,
// not a peer, reaches charon), loads espd's table with the page's block
// (which adds the include line) and checks that it is dropped, that the
// tunnel passes, and that both tables survive a restart of
// nftables.service.
func besideDefaultRuleset(t *testing.T, bed *packageBed, inet *testbed.Node, debianConf string) {
	t.Helper()
	c := bed.gw["A"]
	remove := markedBlock(t, firewallDoc, "sh", "remove espd table")
	if out, err := c.run(nil, "sh", "-ec", remove); err != nil {
		t.Fatalf("gateway A: %s: %v\n%s", remove, err, out)
	}
	checkTables(t, bed, "A", false, "drop")
	c.must(t, "systemctl", "restart", "nftables")
	checkTables(t, bed, "A", false, "drop")
	if !strings.Contains(debianConf, "policy") && strings.Contains(debianConf, "table inet filter") {
		if out, err := c.run([]byte(debianConf), "install", "-m", "0755", "/dev/stdin", "/etc/nftables.conf"); err != nil {
			t.Fatalf("gateway A: writing Debian's /etc/nftables.conf: %v\n%s", err, out)
		}
	} else {
		t.Fatalf("gateway A: the container's /etc/nftables.conf is not Debian's default:\n%s", debianConf)
	}
	c.must(t, "systemctl", "restart", "nftables")
	checkTables(t, bed, "A", false, "accept")
	espdTableDrops(t, bed, 40100, false)
	for fam, seen := range strangerIKE(t, bed, inet, 20*time.Second) {
		if !seen {
			t.Errorf("%v IKE from the internet host without espd's table: charon on A did not log it, so the probe shows nothing", fam)
		}
	}

	loadEspdTable(t, bed, "A")
	if conf := c.must(t, "cat", "/etc/nftables.conf"); !strings.HasSuffix(conf, "include \"/etc/nftables.d/*.nft\"\n") {
		t.Errorf("gateway A: the load block did not add the include line to Debian's /etc/nftables.conf:\n%s", conf)
	}
	checkTables(t, bed, "A", true, "accept")
	espdTableDrops(t, bed, 40200, true)
	for fam, seen := range strangerIKE(t, bed, inet, 5*time.Second) {
		if seen {
			t.Errorf("%v IKE from the internet host, not a peer, reached charon on A beside espd's table", fam)
		}
	}
	tunnelPings(t, bed, "beside Debian's default ruleset")
	c.must(t, "systemctl", "restart", "nftables")
	checkTables(t, bed, "A", true, "accept")
}

// loadBoxRuleset writes the page's `nft box ruleset` block to each
// gateway's /etc/nftables.conf and runs its `sh load box ruleset` block.
func loadBoxRuleset(t *testing.T, bed *packageBed) {
	t.Helper()
	box := markedBlock(t, firewallDoc, "nft", "box ruleset")
	load := markedBlock(t, firewallDoc, "sh", "load box ruleset")
	for _, name := range []string{"A", "B"} {
		c := bed.gw[name]
		if out, err := c.run([]byte(box), "install", "-m", "0755", "/dev/stdin", "/etc/nftables.conf"); err != nil {
			t.Fatalf("gateway %s: writing /etc/nftables.conf: %v\n%s", name, err, out)
		}
		if out, err := c.run(nil, "sh", "-ec", load); err != nil {
			t.Fatalf("gateway %s: %s: %v\n%s", name, load, err, out)
		}
		checkTables(t, bed, name, false, "drop")
	}
	t.Logf("docs/firewall.md's box ruleset loaded on both gateways")
}

// loadEspdTable writes the page's `nft espd table A` (or B) block to the
// gateway's /etc/nftables.d/espd.nft and runs its `sh load espd table`
// block.
func loadEspdTable(t *testing.T, bed *packageBed, name string) {
	t.Helper()
	table := markedBlock(t, firewallDoc, "nft", map[string]string{"A": "espd table A", "B": "espd table B"}[name])
	load := markedBlock(t, firewallDoc, "sh", "load espd table")
	for _, want := range []string{"nft -f /etc/nftables.d/espd.nft\n", "systemctl enable nftables\n"} {
		if !strings.Contains(load, want) {
			t.Fatalf("docs/firewall.md's `sh load espd table` block does not run %q:\n%s", want, load)
		}
	}
	c := bed.gw[name]
	if out, err := c.run([]byte(table), "sh", "-ec", "mkdir -p /etc/nftables.d && cat > /etc/nftables.d/espd.nft"); err != nil {
		t.Fatalf("gateway %s: writing /etc/nftables.d/espd.nft: %v\n%s", name, err, out)
	}
	if out, err := c.run(nil, "sh", "-ec", load); err != nil {
		t.Fatalf("gateway %s: %s: %v\n%s", name, load, err, out)
	}
}

// checkTables checks the gateway's loaded ruleset: the box's table inet
// filter with input and forward at the policy, its table ip nat with the
// page's box ruleset (policy drop), espd's table inet espd if espd, not
// otherwise; and nftables.service active and enabled.
func checkTables(t *testing.T, bed *packageBed, name string, espd bool, policy string) {
	t.Helper()
	c := bed.gw[name]
	for _, chain := range []string{"input", "forward"} {
		out, err := c.run(nil, "nft", "list", "chain", "inet", "filter", chain)
		if want := "policy " + policy + ";"; err != nil || !strings.Contains(out, want) {
			t.Fatalf("gateway %s: the box's chain %s (want %s): %v\n%s", name, chain, want, err, out)
		}
	}
	if policy == "drop" {
		if out, err := c.run(nil, "nft", "list", "table", "ip", "nat"); err != nil || !strings.Contains(out, "masquerade") {
			t.Fatalf("gateway %s: the box's table ip nat: %v\n%s", name, err, out)
		}
	}
	out, err := c.run(nil, "nft", "list", "table", "inet", "espd")
	if espd && (err != nil || !strings.Contains(out, "maxseg size set rt mtu")) || !espd && err == nil {
		t.Fatalf("gateway %s: espd's table loaded %v, want %v: %v\n%s", name, err == nil, espd, err, out)
	}
	if p := c.show(t, "nftables.service", "ActiveState", "UnitFileState"); p["ActiveState"] != "active" || p["UnitFileState"] != "enabled" {
		t.Fatalf("gateway %s: nftables.service %v, want active and enabled", name, p)
	}
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
