package strongswantest

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

// The active/standby pair under charon: testbed.Pair's two nodes each run
// espd, charon with the espd plugin and strongSwan's ha plugin, and
// keepalived, which moves the pair's virtual addresses (gateway A's of the
// line topology) and, through its notify FIFO script (haNotifyScript),
// switches the ha plugin's segment. The peer is the pair's gwB (espd and charon as in
// site_test.go), the server the host behind it; the client is the host
// behind the pair.
//
// The ha plugin (strongSwan 5.9.8, src/libcharon/plugins/ha): the active
// node's charon pushes every IKE_SA (keys, message IDs) and CHILD_SA
// (nonces, DH secret, SPIs, selectors) over UDP 4510 between the sync
// addresses (in clear on the sync link: without the plugin's "secret",
// which would protect them with an IPsec SA of charon's own); the other node's charon keeps the IKE_SA PASSIVE and derives
// and installs the CHILD_SA at once, through its kernel-ipsec backend
// (here the espd plugin). Activating a segment only turns the PASSIVE
// IKE_SAs of that segment ESTABLISHED. Segments are switched by writing
// "+<n>" or "-<n>" into the FIFO IPSEC_PIDDIR/charon.ha (/var/run/charon.ha
// on Debian), which charon here finds in the private /run of its mount
// namespace (gateway.startCharon); a switch is announced to the other
// node, which does the opposite (a take there drops here, a drop
// activates).

// haSegment is the one segment of the pair (segment_count = 1).
const haSegment = 1

// haPairPort is the UDP port of the espds' pair link.
const haPairPort = 4520

// haTakeoverBound is how long the standby may take to hold the addresses
// and activate its segment after the active node died (generous: with
// keepalived's 0.2 s adverts it takes about a second).
const haTakeoverBound = 30 * time.Second

// haResumeBound is how soon after the takeover the traffic through the
// tunnel must flow again: it fails a pair that does not resume by itself,
// not a slow one (the gap measured, about a second, is logged).
const haResumeBound = 20 * time.Second

// haPair is the pair under test with its peer.
type haPair struct {
	p            *testbed.Pair
	node1, node2 *haNode
	peer         *gateway
	vips         []string
	// syncSecret is the ha plugin's secret and swanSecrets the pair's
	// swanctl secrets, both made by docs/ha.md's blocks as written.
	syncSecret, swanSecrets string
}

// newHAPair builds the pair and the peer and starts everything: espd and
// charon on the three gateways, the connections loaded, then keepalived
// on both nodes; it waits until node1 holds the addresses and its segment
// alone is active.
func newHAPair(t *testing.T) *haPair {
	t.Helper()
	p := testbed.NewPairT(t)
	h := &haPair{p: p,
		node1: &haNode{gateway: newGateway(t, p.Node1, "node1")},
		node2: &haNode{gateway: newGateway(t, p.Node2, "node2")},
		peer:  newGateway(t, p.GwB, "peer"),
		vips: []string{testbed.GwATransitV4.Addr().String(), testbed.GwALANV4.Addr().String(),
			testbed.GwATransitV6.Addr().String(), testbed.GwALANV6.Addr().String()},
	}
	h.node1.slowStop, h.node2.slowStop = true, true
	// The two espds' pair link, on the sync link beside the ha plugin's.
	key := filepath.Join(t.TempDir(), "pair.key")
	if err := os.WriteFile(key, []byte("5eed"+strings.Repeat("0123456789abcdef", 3)+"0123456789ab\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for i, n := range []*haNode{h.node1, h.node2} {
		n.startEspd(haEspdFlags(i, key, n.roleFile())...)
	}
	h.peer.startEspd()
	h.syncSecret, _ = testbed.RunSecretBlock(t, haDoc(t, "sh", "ha strongswan secret"))
	h.node1.startCharon(haCharonOptions(t, testbed.Node1SyncV4, testbed.Node2SyncV4, h.syncSecret))
	h.node2.startCharon(haCharonOptions(t, testbed.Node2SyncV4, testbed.Node1SyncV4, h.syncSecret))
	h.peer.startCharon(charonOptions{})

	// The pair's side of the connection (docs/ha.md's, as written) has
	// the transit address both nodes share, the peer's the pair's; the
	// peer takes the key the page's secret block made.
	var psKey string
	h.swanSecrets, psKey = testbed.RunSecretBlock(t, haDoc(t, "sh", "ha swanctl secret"))
	_, peerConn := v4("aes128gcm16")
	h.node1.load(haDoc(t, "conf", "ha swanctl") + h.swanSecrets)
	h.node2.load(haDoc(t, "conf", "ha swanctl") + h.swanSecrets)
	h.peer.load(strings.ReplaceAll(peerConn.String(), psk, psKey))

	for _, n := range []*haNode{h.node1, h.node2} {
		fifo := haFIFO(n.gateway)
		if !waitFor(10*time.Second, func() bool { st, err := os.Stat(fifo); return err == nil && st.Mode()&os.ModeNamedPipe != 0 }) {
			t.Fatalf("%s: charon made no HA FIFO %s", n.name, fifo)
		}
	}
	// nopreempt: whichever node is master first stays master, so node1
	// starts first and holds the addresses before node2 starts.
	start := time.Now()
	h.node1.startKeepalived(t, 150)
	for _, a := range h.vips {
		if ok, holders := testbed.WaitHeldBy(p.Nodes(), p.Node1, a, 30*time.Second); !ok {
			t.Fatalf("at start: %s held by %v, want node1 alone", a, holders)
		}
	}
	h.node2.startKeepalived(t, 100)
	// keepalived announces backup on both nodes as it starts, then master
	// on node1; each announcement reaches the other charon too. Wait for
	// the last ones to have run and the segments to have settled.
	settled := func() bool {
		return strings.Contains(h.node1.lastNotify(), fmt.Sprintf("done +%d rc=0", haSegment)) &&
			strings.Contains(h.node2.lastNotify(), fmt.Sprintf("done -%d rc=0", haSegment)) &&
			h.node1.segmentActive() && !h.node2.segmentActive()
	}
	if !waitFor(20*time.Second, settled) {
		t.Fatalf("segments not settled: node1 active %v (notify %q), node2 active %v (notify %q)",
			h.node1.segmentActive(), h.node1.lastNotify(), h.node2.segmentActive(), h.node2.lastNotify())
	}
	t.Logf("node1 holds the addresses and segment %d, node2 is standby (%v after keepalived started)",
		haSegment, time.Since(start).Round(time.Millisecond))
	return h
}

// up brings the CHILD_SA up from the peer, waits until node2 holds its
// copy and the server reaches the client through node1, and starts the
// captures of the three transit sides.
func (h *haPair) up(t *testing.T) (childSA, *testbed.PairCaptures) {
	t.Helper()
	h.peer.mustSwanctl("--initiate", "--child", "net", "--timeout", "20")
	peerChild := h.peer.waitChild("net", 10*time.Second)
	h.node2.waitChild("net", 10*time.Second)
	h.pingServerToClient(t, "node1 active")
	return peerChild, testbed.StartPairCaptures(t, h.p)
}

// pingServerToClient requires that the server (behind the peer) reaches
// the client (behind the pair), retrying (bounded) while the tunnel and
// the neighbours settle.
func (h *haPair) pingServerToClient(t *testing.T, when string) {
	t.Helper()
	var r testbed.PingResult
	ok := waitFor(20*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var err error
		r, err = h.p.Server.Ping(ctx, testbed.ClientV4.Addr(), testbed.PingOptions{Count: 3, Interval: 100 * time.Millisecond, Wait: time.Second})
		return err == nil && r.OK()
	})
	if !ok {
		t.Fatalf("%s: the server does not reach the client:\n%s", when, r.Output)
	}
}

// requireHA fails (in CI) or skips the test without strongSwan and its ha
// plugin.
func requireHA(t *testing.T) {
	t.Helper()
	requireStrongSwan(t)
	if _, err := os.Stat("/usr/lib/ipsec/plugins/libstrongswan-ha.so"); err != nil {
		msg := "strongSwan's ha plugin is not installed (apt-get install libcharon-extra-plugins)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// TestHAPair: an active/standby pair of charon + espd gateways with the
// ha plugin, keepalived (nopreempt) switching the addresses, the segment
// and espd's role. The peer brings the tunnel up to the pair's address;
// the standby's charon gets the IKE_SA and the CHILD_SA through the ha
// plugin and its espd the same states, silent. Then, with pings and a TCP
// transfer running, the active node dies (espd, charon and keepalived
// killed, its links cut): the standby carries the traffic on within
// haResumeBound, above the dead node's sequence numbers, with the peer's
// SPIs unchanged and no replay or integrity drop at the peer. The dead
// node comes back, is resynchronised (the ha plugin's rekey burst) and
// stands by; then the other node dies and it takes over again, with the
// same checks. Captures of both nodes' and the peer's transit sides show
// no (SPI, sequence number) sent twice and no cleartext.
func TestHAPair(t *testing.T) {
	requireHA(t)
	h := newHAPair(t)
	n1, n2, peer := h.node1, h.node2, h.peer

	// 2. The peer brings the CHILD_SA up to the pair's address; node1
	// answers, and the server reaches the client through it.
	peer.mustSwanctl("--initiate", "--child", "net", "--timeout", "20")
	peerChild := peer.waitChild("net", 10*time.Second)
	c1 := n1.waitChild("net", 10*time.Second)
	if st := n1.ikeState(); st != "ESTABLISHED" {
		t.Fatalf("node1: IKE_SA %s, want ESTABLISHED", st)
	}
	h.pingServerToClient(t, "node1 active")
	if c, _ := n1.installedChild("net"); c.PacketsIn == 0 || c.PacketsOut == 0 {
		t.Fatalf("node1: the pings did not cross its CHILD_SA: %+v", c)
	}

	// 3. node2's charon has the IKE_SA (passive) and the CHILD_SA through
	// the ha plugin, and its espd the same states as node1's.
	c2 := n2.waitChild("net", 10*time.Second)
	if st := n2.ikeState(); st != "PASSIVE" {
		t.Fatalf("node2: IKE_SA %q, want PASSIVE:\n%s", st, n2.mustSwanctl("--list-sas"))
	}
	if c2.SPIIn != c1.SPIIn || c2.SPIOut != c1.SPIOut {
		t.Fatalf("node2's CHILD_SA %s/%s, node1's %s/%s", c2.SPIIn, c2.SPIOut, c1.SPIIn, c1.SPIOut)
	}
	if c1.SPIIn != peerChild.SPIOut || c1.SPIOut != peerChild.SPIIn {
		t.Fatalf("node1's CHILD_SA %s/%s does not match the peer's %s/%s", c1.SPIIn, c1.SPIOut, peerChild.SPIIn, peerChild.SPIOut)
	}
	s1 := n1.pairSPIs()
	var s2 map[string][]string
	if !waitFor(5*time.Second, func() bool {
		s2 = n2.pairSPIs()
		return fmt.Sprint(s2) == fmt.Sprint(s1)
	}) {
		t.Fatalf("espd states: node2 %v, node1 %v", s2, s1)
	}
	if len(s1["in"]) != 1 || len(s1["out"]) != 1 || s1["in"][0] != c1.SPIIn || s1["out"][0] != c1.SPIOut {
		t.Fatalf("node1's espd states %v, want charon's %s/%s", s1, c1.SPIIn, c1.SPIOut)
	}
	if p1, p2 := n1.espdPolicies(), n2.espdPolicies(); p1 != p2 || p2 == 0 {
		t.Fatalf("espd policies: node1 %d, node2 %d", p1, p2)
	}
	if r := n2.tunnelRoutes(); !strings.Contains(r, testbed.LANBV4.String()) {
		t.Errorf("node2: no route to %v into the TUN: %q", testbed.LANBV4, r)
	}
	t.Logf("node2 (standby) has IKE_SA PASSIVE and CHILD_SA %s/%s in charon and espd", c2.SPIIn, c2.SPIOut)
	t.Logf("node1 espd:\n%s", n1.mustEspctl("sa", "list"))
	t.Logf("node2 espd:\n%s", n2.mustEspctl("sa", "list"))

	// Some traffic before the failover, so that node1's sequence numbers
	// (and the peer's replay window) are well ahead of 1: 300 echo
	// requests and replies. Every ESP and cleartext frame on the three
	// transit sides is captured from here to the end.
	caps := testbed.StartPairCaptures(t, h.p)
	ctx := context.Background()
	if r, err := h.p.Server.Ping(ctx, testbed.ClientV4.Addr(), testbed.PingOptions{Count: 300, Interval: 5 * time.Millisecond, Wait: time.Second}); err != nil || r.Received < 290 {
		t.Fatalf("burst before the failover: %v\n%s", err, tail(r.Output, 5))
	}
	// The standby sent nothing on its copy of the CHILD_SA: its outbound
	// state is silent (its counter stands where the active's reports put
	// it, and it holds no address to draw traffic anyway).
	found := false
	for _, x := range n2.stats().SAs {
		if fmt.Sprintf("%08x", x.SPI) == c2.SPIOut {
			found = true
			if x.Stats.Packets != 0 {
				t.Fatalf("node2, standing by, sent %d packets on spi %s", x.Stats.Packets, c2.SPIOut)
			}
		}
	}
	if !found {
		t.Fatalf("node2's espd has no state spi %s", c2.SPIOut)
	}

	// 4. node1 dies with the traffic running: espd, charon and keepalived
	// killed together, and its links cut, as a node that lost power.
	h.failover(t, n1, n2, peerChild, func() {
		for _, p := range []*testbed.Process{n1.espd, n1.charon, n1.keepalived} {
			crashProcess(t, p)
		}
		h.p.Cut(t, n1.node, true)
		for _, p := range []*testbed.Process{n1.espd, n1.charon, n1.keepalived} {
			reapKilled(t, p)
		}
	})

	// 5. node1 comes back (its addresses gone, as after a reboot; its
	// state directory kept): the ha plugin resynchronises it and rekeys
	// the CHILD_SA (the rekey burst), and node1 stands by (nopreempt)
	// with the new CHILD_SA, while the traffic goes on through node2.
	tr := testbed.StartFailoverTraffic(h.p, 20*time.Second)
	peerBefore := peer.stats()
	h.restartNode(t, n1, 150)
	newChild := h.waitResync(t, n1, n2, peerChild)
	tr.Wait(t)
	checkTraffic(t, tr, "during node1's return and the resync", time.Time{}, h.peer, newChild, peerBefore)

	// 6. node2 dies: node1 takes over again, continuing the new CHILD_SA
	// exactly.
	h.failover(t, n2, n1, newChild, func() {
		for _, p := range []*testbed.Process{n2.espd, n2.charon, n2.keepalived} {
			crashProcess(t, p)
		}
		h.p.Cut(t, n2.node, true)
		for _, p := range []*testbed.Process{n2.espd, n2.charon, n2.keepalived} {
			reapKilled(t, p)
		}
	})

	// The whole run: neither node sent an (SPI, sequence number) twice,
	// and nothing crossed the transit link in clear.
	caps.Check(t)
}

// checkTraffic requires what a failover (at tookOver; zero: none
// expected) must leave: the traffic through the pair as
// testbed.FailoverTraffic.Check requires it (answered again within
// haResumeBound); the peer's CHILD_SA as child, its espd's states the
// same, and no replay or integrity drop at the peer since before.
func checkTraffic(t *testing.T, tr *testbed.FailoverTraffic, what string, tookOver time.Time, peer *gateway, child childSA, before espdStats) {
	t.Helper()
	tr.Check(t, what, tookOver, haResumeBound)
	after, ok := peer.installedChild("net")
	if !ok || after.SPIIn != child.SPIIn || after.SPIOut != child.SPIOut {
		t.Errorf("%s: the peer's CHILD_SA changed: before %s/%s, after %+v (installed %v)", what, child.SPIIn, child.SPIOut, after, ok)
	}
	if spis := peer.espdSPIs(); len(spis["in"]) != 1 || spis["in"][0] != child.SPIIn || len(spis["out"]) != 1 || spis["out"][0] != child.SPIOut {
		t.Errorf("%s: the peer's espd states changed: %v, want in %s out %s", what, spis, child.SPIIn, child.SPIOut)
	}
	st := peer.stats()
	var replays, integrity uint64
	for _, spi := range []string{child.SPIIn} {
		replays += st.saDrop(spi, "replay") - before.saDrop(spi, "replay")
		integrity += st.saDrop(spi, "integrity") - before.saDrop(spi, "integrity")
	}
	t.Logf("%s: peer espd %s; %s; global drops %v", what, st.saLine(child.SPIIn), st.saLine(child.SPIOut), nonZero(st.Global.Drops))
	if replays != 0 || integrity != 0 {
		t.Errorf("%s: the peer dropped %d packets from the pair as replays and %d for their ICV", what, replays, integrity)
	}
}

// failover kills the active node with kill while the traffic runs and
// checks that the standby takes the addresses and its segment and
// carries the traffic on (checkTraffic).
func (h *haPair) failover(t *testing.T, active, standby *haNode, child childSA, kill func()) {
	t.Helper()
	what := fmt.Sprintf("%s fails over to %s", active.name, standby.name)
	tr := testbed.StartFailoverTraffic(h.p, 12*time.Second)
	// Let the traffic run through the active node for a while first.
	if !waitFor(20*time.Second, func() bool { return time.Since(tr.Start) > 3*time.Second }) {
		t.Fatal("unreachable")
	}
	peerBefore := h.peer.stats()
	activations := standby.activations()
	killed := time.Now()
	kill()
	var held []string
	if !waitFor(haTakeoverBound, func() bool {
		held = nil
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, a := range h.vips {
			if standby.node.HoldsAddr(ctx, a) {
				held = append(held, a)
			}
		}
		return len(held) == len(h.vips)
	}) {
		t.Fatalf("%s: %s holds only %v of %v %v after %s died", what, standby.name, held, h.vips, haTakeoverBound, active.name)
	}
	tookVIPs := time.Now()
	if !waitFor(haTakeoverBound, func() bool { return standby.activations() > activations && standby.segmentActive() }) {
		t.Fatalf("%s: %s's segment %d not activated %v after %s died (notify: %q)", what, standby.name, haSegment, haTakeoverBound, active.name, standby.lastNotify())
	}
	if !waitFor(5*time.Second, func() bool { return standby.ikeState() == "ESTABLISHED" }) {
		t.Fatalf("%s: %s's IKE_SA %q after the segment's activation, want ESTABLISHED", what, standby.name, standby.ikeState())
	}
	t.Logf("%s: %s held the addresses %v after %s died, its segment %v after; keepalived had told its notify script %v after",
		what, standby.name, tookVIPs.Sub(killed).Round(time.Millisecond), active.name, time.Since(killed).Round(time.Millisecond),
		standby.lastNotifyAt("start", fmt.Sprintf("+%d", haSegment)).Sub(killed).Round(time.Millisecond))
	tr.Wait(t)
	// The addresses moved at tookVIPs at the latest; the takeover of the
	// states is what the notify script started then.
	checkTraffic(t, tr, what, tookVIPs, h.peer, child, peerBefore)
	st := standby.stats()
	t.Logf("%s: %s's espd %s; %s; pair: %s", what, standby.name, st.saLine(child.SPIIn), st.saLine(child.SPIOut),
		strings.TrimSpace(standby.mustEspctl("pair", "status")))
	if t.Failed() {
		t.Logf("%s's charon, HA and state lines:\n%s", standby.name, grepLines(standby.charon.Log(), 60,
			"HA ", "segment", "PASSIVE", "state change", "espd: ", "scheduling", "DPD", "MOBIKE", "roam", "INFORMATIONAL"))
		t.Logf("%s's espd, warnings, errors and the pair:\n%s", standby.name, grepLines(standby.espd.Log(), 40, "level=WARN", "level=ERROR", "component=pair"))
		t.FailNow()
	}
}

// restartNode brings a node that failed back as after a reboot: the
// pair's addresses it still had are removed, its links are up again, and
// espd (the same state directory), charon (the ha plugin asks the other
// node for a resync) and keepalived start again.
func (h *haPair) restartNode(t *testing.T, n *haNode, priority int) {
	t.Helper()
	for _, v := range []struct {
		p   netip.Prefix
		ifn string
	}{{testbed.GwATransitV4, testbed.IfTransit}, {testbed.GwATransitV6, testbed.IfTransit}, {testbed.GwALANV4, testbed.IfLAN}, {testbed.GwALANV6, testbed.IfLAN}} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		held := n.node.HoldsAddr(ctx, v.p.Addr().String())
		cancel()
		if held {
			n.node.MustIP(t, "addr", "del", v.p.String(), "dev", v.ifn)
		}
	}
	h.p.Cut(t, n.node, false)
	n.runEspd()
	sync, other := testbed.Node1SyncV4, testbed.Node2SyncV4
	if n == h.node2 {
		sync, other = other, sync
	}
	n.startCharon(haCharonOptions(t, sync, other, h.syncSecret))
	n.load(haDoc(t, "conf", "ha swanctl") + h.swanSecrets)
	fifo := haFIFO(n.gateway)
	if !waitFor(10*time.Second, func() bool { st, err := os.Stat(fifo); return err == nil && st.Mode()&os.ModeNamedPipe != 0 }) {
		t.Fatalf("%s: charon made no HA FIFO %s", n.name, fifo)
	}
	n.startKeepalived(t, priority)
}

// waitResync waits until the node that came back holds, from the ha
// plugin's resync, the CHILD_SA that the active node's rekey burst made
// (its SPIs differ from old), with the same states in its espd as the
// active's, standing by; it returns the peer's new CHILD_SA.
func (h *haPair) waitResync(t *testing.T, back, active *haNode, old childSA) childSA {
	t.Helper()
	var peerChild childSA
	if !waitFor(30*time.Second, func() bool {
		c, ok := h.peer.installedChild("net")
		peerChild = c
		return ok && c.SPIIn != old.SPIIn && c.SPIOut != old.SPIOut && len(h.peer.childSAs()) == 1
	}) {
		t.Fatalf("no rekey of the CHILD_SA after %s's resync: the peer has %+v", back.name, h.peer.childSAs())
	}
	var sb, sa map[string][]string
	if !waitFor(20*time.Second, func() bool {
		sb, sa = back.pairSPIs(), active.pairSPIs()
		return fmt.Sprint(sb) == fmt.Sprint(sa) && len(sa["out"]) == 1 && sa["out"][0] == peerChild.SPIIn
	}) {
		t.Fatalf("after the resync: %s's espd has %v, %s's %v, the peer's CHILD_SA %s/%s", back.name, sb, active.name, sa, peerChild.SPIIn, peerChild.SPIOut)
	}
	if !waitFor(20*time.Second, func() bool { return strings.Contains(back.lastNotify(), fmt.Sprintf("done -%d rc=0", haSegment)) }) {
		t.Fatalf("%s did not stand by after it came back (notify %q)", back.name, back.lastNotify())
	}
	st := strings.TrimSpace(back.mustEspctl("pair", "status"))
	if !strings.Contains(st, "role standby") {
		t.Fatalf("%s's espd after it came back: %s", back.name, st)
	}
	t.Logf("%s came back: the resync's rekey made CHILD_SA %s/%s (was %s/%s); both espds hold it; %s's espd: %s; %s",
		back.name, peerChild.SPIIn, peerChild.SPIOut, old.SPIIn, old.SPIOut, back.name, st,
		grepLines(active.charon.Log(), 3, "resyncing"))
	return peerChild
}
