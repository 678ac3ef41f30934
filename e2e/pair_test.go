package e2e

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/espd/espd/internal/docblock"
	"github.com/espd/espd/testbed"
)

// pairPort is the UDP port of the espds' pair link in these tests.
const pairPort = 4520

// resumeBound fails a pair whose traffic does not resume by itself after
// a failover or a restart, not a slow one: the gaps measured (about a
// second) are logged.
const resumeBound = 20 * time.Second

// pairNode is one node of a manually keyed pair: espd and keepalived.
type pairNode struct {
	name       string
	node       *testbed.Node
	espd       *espd
	keepalived *testbed.Process
	dir        string
}

// roleFile is where the notify script records the node's role for espd:
// in a directory the script makes, as docs/ha.md's /var/lib/espd-pair.
func (n *pairNode) roleFile() string { return filepath.Join(n.dir, "espd-pair", "role") }

// checkRoleFile checks what the notify script left: the role file says
// role, is a regular file of root's, mode 0644, alone in a directory of
// root's, mode 0755 (no temporary file left behind).
func (n *pairNode) checkRoleFile(t testing.TB, role string) {
	t.Helper()
	p := n.roleFile()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	di, err := os.Stat(filepath.Dir(p))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	ents, _ := os.ReadDir(filepath.Dir(p))
	if fi.Mode() != 0o644 || di.Mode() != os.ModeDir|0o755 || fi.Sys().(*syscall.Stat_t).Uid != 0 || di.Sys().(*syscall.Stat_t).Uid != 0 ||
		string(b) != role+"\n" || len(ents) != 1 {
		t.Errorf("%s's role file: %v %q in %v with %d entries, want %q, mode 0644 alone in 0755, root's", n.name, fi.Mode(), b, di.Mode(), len(ents), role)
	}
}

// TestPairManual: a gateway pair keyed by hand, without charon. Both
// nodes' espds load the same configuration file (the tunnel from the
// pair's transit address to gwB) with --pair-node and docs/ha.md's pair
// key, and keepalived runs docs/ha.md's notify script as written (no
// charon). Neither node was ever active: node1, master first, takes over
// above node2's own report of its reservations and carries the traffic.
// Then node1 dies (espd and keepalived killed, links cut) with pings and
// a TCP transfer running: node2 carries them on within 3 s, above node1's
// numbers, without a replay or integrity drop at the peer. Then node2's
// espd is killed and restarted alone (keepalived stays master, node1 is
// still dead): it takes its role from the role file and, once the lease
// has passed without a report from the dead node, continues above its own
// record. Captures of both nodes' and the peer's transit sides show no
// (SPI, sequence number) twice and no cleartext.
func TestPairManual(t *testing.T) {
	mp := newManualPair(t)
	p, nodes, peer, b4, spiOut := mp.p, mp.nodes, mp.peer, mp.b4, mp.spiOut

	// 1. node1 (master) releases the tunnel's outbound state once node2's
	// own report is fresh, and the tunnel works.
	mp.released(t)
	if st := nodes[1].status(t); !strings.Contains(st, "role standby") {
		t.Fatalf("node2: %s", st)
	}
	caps := testbed.StartPairCaptures(t, p)
	ctx := context.Background()
	if r, err := p.Server.Ping(ctx, testbed.ClientV4.Addr(), testbed.PingOptions{Count: 200, Interval: 5 * time.Millisecond, Wait: time.Second}); err != nil || r.Received < 190 {
		t.Fatalf("through node1: %v\n%s", err, tail(r.Output, 5))
	}

	// 2. node1 dies with the traffic running.
	before := peerDrops(t, peer, spiOut, b4)
	tr := testbed.StartFailoverTraffic(p, 12*time.Second)
	if !eventually(20*time.Second, func() bool { return time.Since(tr.Start) > 3*time.Second }) {
		t.Fatal("unreachable")
	}
	killed := time.Now()
	mp.killNode1(t)
	mp.node2Holds(t)
	took := time.Now()
	t.Logf("node2 holds the addresses %v after node1 died", took.Sub(killed).Round(time.Millisecond))
	tr.Check(t, "node1 fails over to node2", took, resumeBound)
	if after := peerDrops(t, peer, spiOut, b4); after != before {
		t.Errorf("the peer's replay and integrity drops went from %v to %v", before, after)
	}
	if st := nodes[1].status(t); !strings.Contains(st, "role active released 1 silent 0") {
		t.Errorf("node2 after the takeover: %s", st)
	}

	// 3. node2's espd alone is killed and restarted: its keepalived stays
	// master, node1 is still dead. The role file makes it active; with no
	// fresh report from node1 it continues above its own record after
	// the lease.
	nodes[1].checkRoleFile(t, "active")
	nodes[1].espd.kill(t)
	restarted := time.Now()
	nodes[1].espd = startEspd(t, p.Node2, mp.args(1)...)
	if st := nodes[1].status(t); !strings.Contains(st, "role active") {
		t.Fatalf("node2's restarted espd: %s", st)
	}
	tr = testbed.StartFailoverTraffic(p, 12*time.Second)
	// The lease (5 s) and a tenth, then the retry's interval.
	tr.Check(t, "node2's espd restarted", restarted, resumeBound)
	if after := peerDrops(t, peer, spiOut, b4); after != before {
		t.Errorf("the peer's replay and integrity drops went from %v to %v", before, after)
	}
	if !nodes[1].espd.logContains("above this node's own record: state continues") {
		t.Errorf("node2's restarted espd did not continue above its own record")
	}
	caps.Check(t)
}

// peerDrops returns the peer's replay and integrity drops of the state
// from the pair.
func peerDrops(t *testing.T, peer *espd, spi uint32, dst netip.Addr) [2]uint64 {
	t.Helper()
	return [2]uint64{peer.saCounter(t, spi, dst, cntReplay...), peer.saCounter(t, spi, dst, cntIntegrity...)}
}

// manualPair is the pair of TestPairManual, running: node1 master.
type manualPair struct {
	p      *testbed.Pair
	nodes  []*pairNode
	peer   *espd
	args   func(i int) []string
	vips   []string
	b4     netip.Addr
	spiOut uint32
}

// newManualPair builds TestPairManual's pair and starts it: espd on the
// three gateways, then keepalived on node1 (until it holds the
// addresses) and on node2.
func newManualPair(t testing.TB) *manualPair {
	t.Helper()
	requireTools(t)
	if _, err := exec.LookPath(testbed.Keepalived); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("keepalived is not installed")
		}
		t.Skip("keepalived is not installed")
	}
	notify, err := docblock.One("../docs/ha.md", "sh", "ha notify")
	if err != nil {
		t.Fatal(err)
	}
	keyBlock, err := docblock.One("../docs/ha.md", "sh", "ha pair key")
	if err != nil {
		t.Fatal(err)
	}
	p := testbed.NewPairT(t)
	dir := t.TempDir()
	// docs/ha.md's key, made as written (in dir instead of /etc/espd, and
	// group root for espd's: this machine has no espd user).
	if !strings.Contains(keyBlock, "/etc/espd/keys/pair.key") || !strings.Contains(keyBlock, "-g espd ") {
		t.Fatalf("docs/ha.md's key block does not write /etc/espd/keys/pair.key for group espd:\n%s", keyBlock)
	}
	keyCmd := strings.NewReplacer("/etc/espd/", dir+"/", "-g espd ", "-g root ").Replace(keyBlock)
	if out, err := exec.Command("sh", "-ec", keyCmd).CombinedOutput(); err != nil {
		t.Fatalf("docs/ha.md's key block: %v\n%s", err, out)
	}
	key := filepath.Join(dir, "keys", "pair.key")

	// The tunnel: the pair's transit address to gwB, LAN A to LAN B.
	vip, b4 := testbed.GwATransitV4.Addr(), testbed.GwBTransitV4.Addr()
	const spiOut, spiIn = 0x7001, 0x7002
	kOut, kIn := randKey(t, 20), randKey(t, 20)
	pairConf := filepath.Join(dir, "pair.toml")
	writeSecret(t, pairConf, gatewayFile([]fileSA{
		{spi: spiOut, dir: "out", src: vip, dst: b4, suite: "aes128gcm16", key: kOut},
		{spi: spiIn, dir: "in", src: b4, dst: vip, suite: "aes128gcm16", key: kIn},
	}, []netip.Prefix{testbed.LANAV4}, []netip.Prefix{testbed.LANBV4}))
	peerConf := filepath.Join(dir, "peer.toml")
	writeSecret(t, peerConf, gatewayFile([]fileSA{
		{spi: spiIn, dir: "out", src: b4, dst: vip, suite: "aes128gcm16", key: kIn},
		{spi: spiOut, dir: "in", src: vip, dst: b4, suite: "aes128gcm16", key: kOut},
	}, []netip.Prefix{testbed.LANBV4}, []netip.Prefix{testbed.LANAV4}))

	syncs := []netip.Prefix{testbed.Node1SyncV4, testbed.Node2SyncV4}
	nodes := []*pairNode{{name: "node1", node: p.Node1}, {name: "node2", node: p.Node2}}
	args := func(i int) []string {
		return []string{"--config", pairConf, "--pair-node", strconv.Itoa(i + 1), "--pair-key-file", key,
			"--pair-listen", netip.AddrPortFrom(syncs[i].Addr(), pairPort).String(),
			"--pair-peer", netip.AddrPortFrom(syncs[1-i].Addr(), pairPort).String(),
			"--pair-role-file", nodes[i].roleFile()}
	}
	for i, n := range nodes {
		n.dir = filepath.Join(dir, n.name)
		if err := os.Mkdir(n.dir, 0o700); err != nil {
			t.Fatal(err)
		}
		n.espd = startEspd(t, n.node, args(i)...)
	}
	peer := startEspd(t, p.GwB, "--config", peerConf)
	startKeepalived := func(n *pairNode, priority int) {
		script := testbed.WriteNotifyScript(t, n.dir, notify, "CHARON_PID=none",
			"ESPCTL="+espctlBin+" -s "+n.espd.sock, "ESPD_PAIR_LOG="+filepath.Join(n.dir, "notify.log"),
			"ESPD_PAIR_ROLE_FILE="+n.roleFile())
		conf := testbed.KeepalivedConf(n.name, testbed.KeepalivedOptions{Priority: priority, NoPreempt: true, AdvertInt: "0.2",
			NotifyFIFO: filepath.Join(n.dir, "keepalived.events"), NotifyScript: script})
		n.keepalived = testbed.StartKeepalived(t, n.node, n.dir, conf)
	}
	vips := []string{testbed.GwATransitV4.Addr().String(), testbed.GwALANV4.Addr().String()}
	startKeepalived(nodes[0], 150)
	for _, a := range vips {
		if ok, holders := testbed.WaitHeldBy(p.Nodes(), p.Node1, a, 30*time.Second); !ok {
			t.Fatalf("at start: %s held by %v, want node1", a, holders)
		}
	}
	startKeepalived(nodes[1], 100)
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range nodes {
				b, _ := os.ReadFile(filepath.Join(n.dir, "notify.log"))
				t.Logf("%s's notify log:\n%s", n.name, b)
			}
		}
	})
	return &manualPair{p: p, nodes: nodes, peer: peer, args: args, vips: vips, b4: b4, spiOut: spiOut}
}

// status is the node's espctl pair status.
func (n *pairNode) status(t testing.TB) string {
	return strings.TrimSpace(n.espd.mustCtl(t, "pair", "status"))
}

// killNode1 kills node1's espd and keepalived and cuts its links.
func (mp *manualPair) killNode1(t testing.TB) {
	t.Helper()
	n := mp.nodes[0]
	n.espd.kill(t)
	if err := syscall.Kill(-n.keepalived.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-n.keepalived.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("keepalived survived SIGKILL")
	}
	n.keepalived.Stop(time.Second) // its exit status is the kill
	mp.p.Cut(t, mp.p.Node1, true)
}

// node2Holds waits (bounded) until node2 holds the pair's addresses.
func (mp *manualPair) node2Holds(t testing.TB) {
	t.Helper()
	if !eventually(30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return mp.p.Node2.HoldsAddr(ctx, mp.vips[0]) && mp.p.Node2.HoldsAddr(ctx, mp.vips[1])
	}) {
		t.Fatal("node2 did not take the addresses")
	}
}

// released waits (bounded) until node1 released its state.
func (mp *manualPair) released(t testing.TB) {
	t.Helper()
	if !eventually(20*time.Second, func() bool { return strings.Contains(mp.nodes[0].status(t), "role active released 1 silent 0") }) {
		t.Fatalf("node1 did not release its state: %s", mp.nodes[0].status(t))
	}
}
