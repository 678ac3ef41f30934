package strongswantest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
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
// tunnel must flow again.
const haResumeBound = 3 * time.Second

// haNode is one node of the pair.
type haNode struct {
	*gateway
	keepalived *testbed.Process
	// notifyLog receives two lines for each command the notify script
	// gives charon.
	notifyLog string
}

// haCharonOptions is the strongswan.conf of a node: the ha plugin between
// the two sync addresses, without its heartbeat (keepalived decides), with
// the FIFO and resynchronisation on, and with the IKE and configuration
// logs at level 2 (IKE_SA state changes, HA messages received).
func haCharonOptions(local, remote netip.Prefix) charonOptions {
	return charonOptions{
		Plugins: "ha",
		Log:     "ike = 2\n      cfg = 2",
		Extra: fmt.Sprintf("charon {\n  plugins {\n    ha {\n      local = %s\n      remote = %s\n"+
			"      segment_count = 1\n      fifo_interface = yes\n      monitor = no\n      resync = yes\n    }\n  }\n}\n",
			local.Addr(), remote.Addr()),
	}
}

// haFIFO is the ha plugin's control FIFO of g's charon, as the host sees
// it: in the private /run of charon's mount namespace.
func haFIFO(g *gateway) string {
	return fmt.Sprintf("/proc/%d/root/run/charon.ha", g.charon.Pid())
}

// haNotifyScript is a node's keepalived vrrp_notify_fifo_script: it reads
// keepalived's state changes, in the order they happened, from the FIFO
// keepalived names as its last argument (notify_master and its kind run
// concurrently, and a quick backup-master-backup at start could reach
// charon out of order) and turns the sync group's into commands for the
// ha plugin: master "+1", backup, fault and stop "-1". It writes each
// into charon's FIFO (waiting, bounded, for charon to have made it; giving
// up if no charon reads within 5 s), then waits, bounded, until charon
// has closed the FIFO: charon reads one command per open, and one written
// while it still handles the previous would be lost. It logs what it did
// to logPath, one "start" and one "done" line per command.
func haNotifyScript(charonPid int, logPath, espctl, sock string) string {
	return fmt.Sprintf(`#!/bin/sh
pid=%[1]d
fifo=/proc/$pid/root/run/charon.ha
log=%[2]q
eval "events=\${$#}"
n=0
while [ "$n" -lt 1000 ] && IFS= read -r line; do
	n=$((n+1))
	case "$line" in
	GROUP*" MASTER"*) cmd=+%[3]d role=active ;;
	GROUP*" BACKUP"*|GROUP*" FAULT"*|GROUP*" STOP"*) cmd=-%[3]d role=standby ;;
	*) continue ;;
	esac
	echo "$(date +%%s.%%N) start $cmd ($line)" >>"$log"
	timeout 10 %[4]q -s %[5]q pair role "$role" >>"$log" 2>&1
	echo "$(date +%%s.%%N) espd $role rc=$?" >>"$log"
	rc=nofifo
	i=0
	while [ "$i" -lt 50 ]; do
		if [ -p "$fifo" ]; then
			timeout 5 sh -c 'printf "%%s\n" "$1" >"$2"' sh "$cmd" "$fifo"
			rc=$?
			break
		fi
		i=$((i+1))
		sleep 0.1
	done
	i=0
	while [ "$rc" = 0 ] && [ "$i" -lt 100 ]; do
		open=0
		for fd in /proc/$pid/fd/*; do
			[ "$(readlink "$fd" 2>/dev/null)" = /run/charon.ha ] && open=1
		done
		[ "$open" = 0 ] && break
		i=$((i+1))
		sleep 0.02
	done
	echo "$(date +%%s.%%N) done $cmd rc=$rc" >>"$log"
done <"$events"
`, charonPid, logPath, haSegment, espctl, sock)
}

// haKeepalivedConf is testbed.KeepalivedConf with the notify FIFO and its
// script.
func haKeepalivedConf(t *testing.T, role string, o testbed.KeepalivedOptions, events, script string) string {
	t.Helper()
	conf := testbed.KeepalivedConf(role, o)
	const defs = "global_defs {\n"
	if !strings.Contains(conf, defs) {
		t.Fatalf("testbed.KeepalivedConf has no %q to add the notify FIFO to:\n%s", defs, conf)
	}
	return strings.Replace(conf, defs, defs+fmt.Sprintf("    script_user root\n    vrrp_notify_fifo %s\n    vrrp_notify_fifo_script %q\n",
		events, script), 1)
}

// startKeepalived starts the node's keepalived with its notify script.
func (n *haNode) startKeepalived(t *testing.T, priority int) {
	t.Helper()
	script := filepath.Join(n.dir, "notify.sh")
	n.notifyLog = filepath.Join(n.dir, "notify.log")
	if err := os.WriteFile(script, []byte(haNotifyScript(n.charon.Pid(), n.notifyLog, espctlBin, n.sock)), 0o700); err != nil {
		t.Fatal(err)
	}
	conf := haKeepalivedConf(t, n.name, testbed.KeepalivedOptions{Priority: priority, AdvertInt: "0.2"},
		filepath.Join(n.dir, "keepalived.events"), script)
	n.keepalived = testbed.StartKeepalived(t, n.node, n.dir, conf)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("keepalived on %s logged:\n%s", n.name, tail(n.keepalived.Log(), 40))
			t.Logf("notify script on %s:\n%s", n.name, n.notifies())
		}
	})
}

// notifies returns the notify script's log.
func (n *haNode) notifies() string {
	b, _ := os.ReadFile(n.notifyLog)
	return string(b)
}

// lastNotify returns the last line of the notify script's log.
func (n *haNode) lastNotify() string {
	lines := strings.Split(strings.TrimSpace(n.notifies()), "\n")
	return lines[len(lines)-1]
}

// lastNotifyAt returns when the notify script last logged event
// ("start": keepalived told it; "done": charon took it) for cmd ("+1"),
// or the zero time.
func (n *haNode) lastNotifyAt(event, cmd string) time.Time {
	var at time.Time
	for _, l := range strings.Split(n.notifies(), "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[1] == event && f[2] == cmd {
			if sec, err := strconv.ParseFloat(f[0], 64); err == nil {
				at = time.Unix(0, int64(sec*1e9))
			}
		}
	}
	return at
}

var haSegmentRE = regexp.MustCompile(`HA segment (\d+) (activated|deactivated), now active: (\S+)`)

// segmentActive reports whether the node's charon last logged the
// segment active (the ha plugin logs every change; none means inactive).
func (n *haNode) segmentActive() bool {
	active := false
	for _, m := range haSegmentRE.FindAllStringSubmatch(n.charon.Log(), -1) {
		active = strings.Contains(","+m[3]+",", fmt.Sprintf(",%d,", haSegment))
	}
	return active
}

// activations counts how often the node's charon activated the segment.
func (n *haNode) activations() int {
	return testbed.CountLines(n.charon.Log(), fmt.Sprintf("HA segment %d activated", haSegment))
}

var ikeStateRE = regexp.MustCompile(`(?m)^s2s: #\d+, (\S+),`)

// ikeState returns the state of the IKE_SA s2s as swanctl lists it, or "".
func (g *gateway) ikeState() string {
	out, err := g.swanctl("--list-sas")
	if err != nil {
		return ""
	}
	if m := ikeStateRE.FindStringSubmatch(out); m != nil {
		return m[1]
	}
	return ""
}

// crashProcess sends SIGKILL to p's whole process group (testbed.Node.Start
// gives each process one of its own) without waiting: keepalived's VRRP
// child dies with its parent instead of shutting down in order (on its
// parent's death alone it would release the addresses and hand over at
// once, which a crashed node does not). reapKilled waits for it.
func crashProcess(t *testing.T, p *testbed.Process) {
	t.Helper()
	if err := syscall.Kill(-p.Pid(), syscall.SIGKILL); err != nil {
		t.Fatalf("%s: %v", p.Name, err)
	}
}

// reapKilled waits for a process killed with SIGKILL to be gone and marks
// it stopped (so that the node's clean-up does not report its exit).
func reapKilled(t *testing.T, p *testbed.Process) {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("%s survived SIGKILL", p.Name)
	}
	p.Stop(time.Second) // its exit status is the kill
}

// espdStats is what "espctl --json stats" reports, as far as used here.
type espdStats struct {
	Global struct {
		Drops      map[string]uint64 `json:"drops"`
		InvalidSPI uint64            `json:"invalid_spi"`
		NoState    uint64            `json:"no_state"`
		Malformed  uint64            `json:"malformed"`
	} `json:"global"`
	SAs []struct {
		SPI   uint32 `json:"spi"`
		Dst   string `json:"dst"`
		Dir   string `json:"dir"`
		Stats struct {
			Packets   uint64            `json:"packets"`
			SeqOut    uint64            `json:"seq_out"`
			ReplayTop uint64            `json:"replay_top"`
			Drops     map[string]uint64 `json:"drops"`
		} `json:"stats"`
	} `json:"sas"`
}

// stats reads espd's counters.
func (g *gateway) stats() espdStats {
	g.t.Helper()
	out := g.mustEspctl("--json", "stats")
	var s espdStats
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		g.t.Fatalf("%s: espctl --json stats: %v\n%s", g.name, err, out)
	}
	return s
}

// saLine describes espd's state spi (hex, as swanctl shows it) from the
// counters: direction, packets, next outbound sequence number, top of the
// replay window and the non-zero drops.
func (s espdStats) saLine(spi string) string {
	for _, x := range s.SAs {
		if fmt.Sprintf("%08x", x.SPI) == spi {
			return fmt.Sprintf("spi %s dir %s packets %d seq_out %d replay_top %d drops %v",
				spi, x.Dir, x.Stats.Packets, x.Stats.SeqOut, x.Stats.ReplayTop, nonZero(x.Stats.Drops))
		}
	}
	return fmt.Sprintf("spi %s: no such state", spi)
}

// saDrop returns the drop counter reason of espd's state spi.
func (s espdStats) saDrop(spi, reason string) uint64 {
	for _, x := range s.SAs {
		if fmt.Sprintf("%08x", x.SPI) == spi {
			return x.Stats.Drops[reason]
		}
	}
	return 0
}

func nonZero(m map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}

// haPair is the pair under test with its peer.
type haPair struct {
	p            *testbed.Pair
	node1, node2 *haNode
	peer         *gateway
	vips         []string
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
	// The two espds' pair link, on the sync link beside the ha plugin's.
	key := filepath.Join(t.TempDir(), "pair.key")
	if err := os.WriteFile(key, []byte("5eed"+strings.Repeat("0123456789abcdef", 3)+"0123456789ab\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	syncs := []netip.Prefix{testbed.Node1SyncV4, testbed.Node2SyncV4}
	for i, n := range []*haNode{h.node1, h.node2} {
		n.startEspd("--pair-node", strconv.Itoa(i+1), "--pair-key-file", key,
			"--pair-listen", netip.AddrPortFrom(syncs[i].Addr(), haPairPort).String(),
			"--pair-peer", netip.AddrPortFrom(syncs[1-i].Addr(), haPairPort).String())
	}
	h.peer.startEspd()
	h.node1.startCharon(haCharonOptions(testbed.Node1SyncV4, testbed.Node2SyncV4))
	h.node2.startCharon(haCharonOptions(testbed.Node2SyncV4, testbed.Node1SyncV4))
	h.peer.startCharon(charonOptions{})

	// The pair's side of the connection has the transit address both
	// nodes share, the peer's the pair's.
	pairConn, peerConn := v4("aes128gcm16")
	h.node1.load(pairConn.String())
	h.node2.load(pairConn.String())
	h.peer.load(peerConn.String())

	for _, n := range []*haNode{h.node1, h.node2} {
		fifo := haFIFO(n.gateway)
		if !waitFor(10*time.Second, func() bool { st, err := os.Stat(fifo); return err == nil && st.Mode()&os.ModeNamedPipe != 0 }) {
			t.Fatalf("%s: charon made no HA FIFO %s", n.name, fifo)
		}
	}
	h.node1.startKeepalived(t, 150)
	h.node2.startKeepalived(t, 100)

	start := time.Now()
	for _, a := range h.vips {
		if ok, holders := testbed.WaitHeldBy(p.Nodes(), p.Node1, a, 30*time.Second); !ok {
			t.Fatalf("at start: %s held by %v, want node1 alone", a, holders)
		}
	}
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

// TestHAPair: an active/standby pair of charon + espd gateways with the
// ha plugin, keepalived switching the addresses and the segment. The peer
// brings the tunnel up to the pair's address; the standby's charon gets
// the IKE_SA and the CHILD_SA through the ha plugin and its espd the same
// states. Then the active node dies (espd, charon and keepalived killed,
// its links cut): the standby takes the addresses and the segment, and
// the traffic must go on through it (checkFailoverTraffic).
func TestHAPair(t *testing.T) {
	requireStrongSwan(t)
	if _, err := os.Stat("/usr/lib/ipsec/plugins/libstrongswan-ha.so"); err != nil {
		msg := "strongSwan's ha plugin is not installed (apt-get install libcharon-extra-plugins)"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
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
	s1 := n1.espdSPIs()
	var s2 map[string][]string
	if !waitFor(5*time.Second, func() bool {
		s2 = n2.espdSPIs()
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
	// requests and replies.
	ctx := context.Background()
	capPeer, err := h.p.GwB.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 128})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { capPeer.Stop() }) // in case the test ends before checkFailoverTraffic stops it
	if r, err := h.p.Server.Ping(ctx, testbed.ClientV4.Addr(), testbed.PingOptions{Count: 300, Interval: 5 * time.Millisecond, Wait: time.Second}); err != nil || r.Received < 290 {
		t.Fatalf("burst before the failover: %v\n%s", err, tail(r.Output, 5))
	}
	st1, st2, stPeer := n1.stats(), n2.stats(), peer.stats()
	t.Logf("before the failover: node1 %s; %s", st1.saLine(c1.SPIOut), st1.saLine(c1.SPIIn))
	t.Logf("before the failover: node2 %s; %s", st2.saLine(c2.SPIOut), st2.saLine(c2.SPIIn))
	t.Logf("before the failover: peer %s; %s", stPeer.saLine(peerChild.SPIIn), stPeer.saLine(peerChild.SPIOut))

	// 4. node1 dies: espd, charon and keepalived killed together, and its
	// links cut, as a node that lost power (a killed keepalived leaves the
	// addresses on node1's links, which would still answer ARP).
	activations := n2.activations()
	killed := time.Now()
	for _, p := range []*testbed.Process{n1.espd, n1.charon, n1.keepalived} {
		crashProcess(t, p)
	}
	h.p.Cut(t, h.p.Node1, true)
	for _, p := range []*testbed.Process{n1.espd, n1.charon, n1.keepalived} {
		reapKilled(t, p)
	}

	// node2 takes the addresses and its segment.
	var held []string
	if !waitFor(haTakeoverBound, func() bool {
		held = nil
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, a := range h.vips {
			if n2.node.HoldsAddr(ctx, a) {
				held = append(held, a)
			}
		}
		return len(held) == len(h.vips)
	}) {
		t.Fatalf("node2 holds only %v of %v %v after node1 died", held, h.vips, haTakeoverBound)
	}
	tookVIPs := time.Now()
	if !waitFor(haTakeoverBound, func() bool { return n2.activations() > activations && n2.segmentActive() }) {
		t.Fatalf("node2's segment %d not activated %v after node1 died (notify: %q)", haSegment, haTakeoverBound, n2.lastNotify())
	}
	tookSegment := time.Now()
	if !waitFor(5*time.Second, func() bool { return n2.ikeState() == "ESTABLISHED" }) {
		t.Fatalf("node2: IKE_SA %q after the segment's activation, want ESTABLISHED", n2.ikeState())
	}
	ctx2, cancel := context.WithTimeout(ctx, 5*time.Second)
	stillOn1 := 0
	for _, a := range h.vips {
		if h.p.Node1.HoldsAddr(ctx2, a) {
			stillOn1++
		}
	}
	cancel()
	t.Logf("node2 was seen holding the addresses %v and its segment active %v after node1 died; keepalived had reported master to its notify script %v after (node1 still has %d of the addresses on its cut links)",
		tookVIPs.Sub(killed).Round(time.Millisecond), tookSegment.Sub(killed).Round(time.Millisecond),
		n2.lastNotifyAt("start", fmt.Sprintf("+%d", haSegment)).Sub(killed).Round(time.Millisecond), stillOn1)

	checkFailoverTraffic(t, h, failover{killed: killed, tookOver: tookVIPs, peerChild: peerChild,
		peerBefore: stPeer, capture: capPeer})
}

// failover is what checkFailoverTraffic needs of the failover.
type failover struct {
	killed, tookOver time.Time
	peerChild        childSA   // the peer's CHILD_SA before the failover
	peerBefore       espdStats // the peer's espd counters before
	capture          *testbed.Capture
}

var pingReplyRE = regexp.MustCompile(`(?m)^\[(\d+\.\d+)\] \d+ bytes from [^:]+: icmp_seq=(\d+)`)

// checkFailoverTraffic observes the traffic from the server to the client
// through the pair for 10 s after the standby took over, logs what
// happened (the pings' replies, the peer's CHILD_SA, the peer espd's
// counters, the ESP the peer received from the pair's address, node2's
// log) and requires that it resumed within haResumeBound of the takeover,
// with the peer's SPIs unchanged and no replay or integrity drops at the
// peer.
func checkFailoverTraffic(t *testing.T, h *haPair, f failover) {
	peer, n2 := h.peer, h.node2

	// 100 echo requests 100 ms apart, each reply timed (-D), missing
	// ones reported as they go (-O).
	const count, interval = 100, 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(count)*interval+15*time.Second)
	defer cancel()
	pingStart := time.Now()
	out, err := h.p.Server.Run(ctx, "ping", "-n", "-D", "-O", "-4", "-c", strconv.Itoa(count), "-i", "0.1", "-W", "1",
		testbed.ClientV4.Addr().String())
	if err != nil && !strings.Contains(out, "packets transmitted") {
		t.Fatalf("ping from the server: %v\n%s", err, out)
	}
	res, _ := h.capture(f)

	var first time.Time
	firstSeq, answered, answeredAfter := 0, 0, 0
	for _, m := range pingReplyRE.FindAllStringSubmatch(out, -1) {
		sec, _ := strconv.ParseFloat(m[1], 64)
		seq, _ := strconv.Atoi(m[2])
		at := time.Unix(0, int64(sec*1e9))
		answered++
		if first.IsZero() {
			first, firstSeq = at, seq
		} else {
			answeredAfter++
		}
	}
	if first.IsZero() {
		t.Logf("failover: none of %d echo requests (from %v after the takeover on) was answered", count,
			pingStart.Sub(f.tookOver).Round(time.Millisecond))
	} else {
		t.Logf("failover: %d of %d echo requests answered; the first (icmp_seq %d) %v after the takeover, %v after node1 died; %d of the %d after it answered",
			answered, count, firstSeq, first.Sub(f.tookOver).Round(time.Millisecond), first.Sub(f.killed).Round(time.Millisecond),
			answeredAfter, count-firstSeq)
	}
	t.Logf("ping:\n%s", tail(out, 6))

	// The peer: its CHILD_SA and espd's counters.
	after, ok := peer.installedChild("net")
	t.Logf("peer's CHILD_SA before %s/%s, after %+v (installed %v)", f.peerChild.SPIIn, f.peerChild.SPIOut, after, ok)
	stPeer := peer.stats()
	in, out2 := f.peerChild.SPIIn, f.peerChild.SPIOut
	t.Logf("peer espd after: %s; %s; global drops %v invalid-spi %d no-state %d malformed %d", stPeer.saLine(in), stPeer.saLine(out2),
		nonZero(stPeer.Global.Drops), stPeer.Global.InvalidSPI, stPeer.Global.NoState, stPeer.Global.Malformed)
	replays := stPeer.saDrop(in, "replay") - f.peerBefore.saDrop(in, "replay")
	integrity := stPeer.saDrop(in, "integrity") - f.peerBefore.saDrop(in, "integrity")
	t.Logf("peer espd dropped %d packets from the pair as replays and %d for their ICV since the failover", replays, integrity)
	st2 := n2.stats()
	t.Logf("node2 espd after: %s; %s; global drops %v invalid-spi %d no-state %d", st2.saLine(out2), st2.saLine(in),
		nonZero(st2.Global.Drops), st2.Global.InvalidSPI, st2.Global.NoState)
	t.Logf("peer's transit link: %s", res)
	t.Logf("node2's charon, HA and state lines:\n%s", grepLines(n2.charon.Log(), 60,
		"HA ", "segment", "PASSIVE", "state change", "espd: ", "scheduling", "DPD", "keepalive", "MOBIKE", "roam", "INFORMATIONAL"))
	t.Logf("node2's espd, warnings and errors:\n%s", grepLines(n2.espd.Log(), 30, "level=WARN", "level=ERROR"))

	// What a working failover shows.
	if first.IsZero() || first.Sub(f.tookOver) > haResumeBound {
		t.Errorf("traffic through the tunnel did not resume within %v of node2's takeover (first reply: %v)", haResumeBound, first)
	} else if lost := count - firstSeq - answeredAfter; lost > 2 {
		t.Errorf("traffic resumed but %d of the %d echo requests after the first answer were lost", lost, count-firstSeq)
	}
	if !ok || after.SPIIn != f.peerChild.SPIIn || after.SPIOut != f.peerChild.SPIOut {
		t.Errorf("the peer's CHILD_SA changed: before %s/%s, after %+v (installed %v)", f.peerChild.SPIIn, f.peerChild.SPIOut, after, ok)
	}
	if spis := peer.espdSPIs(); len(spis["in"]) != 1 || spis["in"][0] != in || len(spis["out"]) != 1 || spis["out"][0] != out2 {
		t.Errorf("the peer's espd states changed: %v, want in %s out %s", spis, in, out2)
	}
	if replays != 0 || integrity != 0 {
		t.Errorf("the peer dropped %d packets from the pair as replays and %d for their ICV after the failover", replays, integrity)
	}
}

// capture stops the peer's capture and summarises the ESP between the
// peer and the pair's address after node1 died: from the pair, the
// sequence numbers by SPI (first ones, last one, count), and the largest
// before; to the pair, the count; and the IKE datagrams.
func (h *haPair) capture(f failover) (string, error) {
	res, err := f.capture.Stop()
	if err != nil {
		return fmt.Sprintf("capture: %v", err), err
	}
	vip := testbed.GwATransitV4.Addr()
	type seqs struct {
		maxBefore uint32
		after     []uint32
	}
	from := map[uint32]*seqs{}
	toAfter, ikeAfter := 0, 0
	for _, fr := range res.Frames {
		isESP := fr.Class == testbed.ClassESP || fr.Class == testbed.ClassESPInUDP
		switch {
		case fr.Class == testbed.ClassIKE && fr.Time.After(f.killed):
			ikeAfter++
		case isESP && !fr.Outgoing && fr.Src == vip:
			s := from[fr.SPI]
			if s == nil {
				s = &seqs{}
				from[fr.SPI] = s
			}
			if fr.Time.Before(f.killed) {
				s.maxBefore = max(s.maxBefore, fr.Seq)
			} else {
				s.after = append(s.after, fr.Seq)
			}
		case isESP && fr.Outgoing && fr.Dst == vip && fr.Time.After(f.killed):
			toAfter++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s; after node1 died: %d ESP to the pair, %d IKE", res.Summary(), toAfter, ikeAfter)
	for spi, s := range from {
		fmt.Fprintf(&b, "; ESP from the pair spi 0x%08x: highest seq before %d, after %d packets", spi, s.maxBefore, len(s.after))
		if n := len(s.after); n > 0 {
			fmt.Fprintf(&b, " seq %v .. %d", s.after[:min(n, 5)], s.after[n-1])
		}
	}
	return b.String(), nil
}

// grepLines returns the lines of log containing any of subs, the last n.
func grepLines(log string, n int, subs ...string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		for _, s := range subs {
			if strings.Contains(l, s) {
				out = append(out, l)
				break
			}
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return strings.Join(out, "\n")
}
