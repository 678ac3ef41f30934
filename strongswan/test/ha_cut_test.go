package strongswantest

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

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

// TestHAPairCut: the active node loses its links (cables pulled) but
// lives on. Its keepalived sees the carrier go, enters FAULT and tells
// its espd and charon to stand by; the other node takes over as in
// TestHAPair. When the links come back the first node stands by
// (nopreempt), the traffic undisturbed; then the second node's links are
// pulled and the first takes over again. Same checks as TestHAPair.
func TestHAPairCut(t *testing.T) {
	requireHA(t)
	h := newHAPair(t)
	n1, n2, peer := h.node1, h.node2, h.peer
	peerChild, caps := h.up(t)

	h.failover(t, n1, n2, peerChild, func() { h.p.Cut(t, n1.node, true) })
	if !waitFor(10*time.Second, func() bool { return strings.Contains(n1.mustEspctl("pair", "status"), "role standby") }) {
		t.Fatalf("node1, cut off, did not stand by: %s", n1.mustEspctl("pair", "status"))
	}

	// The links come back: node1 stands by, the traffic goes on.
	tr := testbed.StartFailoverTraffic(h.p, 8*time.Second)
	before := peer.stats()
	h.p.Cut(t, n1.node, false)
	tr.Wait(t)
	checkTraffic(t, tr, "node1's links back", time.Time{}, peer, peerChild, before)
	if st := n1.mustEspctl("pair", "status"); !strings.Contains(st, "role standby") {
		t.Fatalf("node1 after its links came back: %s", st)
	}

	h.failover(t, n2, n1, peerChild, func() { h.p.Cut(t, n2.node, true) })
	caps.Check(t)
}

// TestHAPairSplitBrain: node2 stops hearing node1's VRRP adverts (they are
// dropped in its nftables input) while everything else works: both nodes
// become masters, both espds active, and the traffic follows the
// gratuitous ARPs of both. This is not a failover the pair survives
// whole (both charons then answer for the same IKE_SA, whose message IDs
// diverge: docs/ha.md), and the test does not require that the traffic
// flows; it requires espd's promise: the two active espds follow each
// other's reservations over the pair link (sa.DB.FollowPeer) and, as the
// captures of both nodes' and the peer's transit sides show, never send
// one (SPI, sequence number) twice, nor anything in clear, during the
// split and after it heals.
func TestHAPairSplitBrain(t *testing.T) {
	requireHA(t)
	h := newHAPair(t)
	n1, n2, peer := h.node1, h.node2, h.peer
	peerChild, caps := h.up(t)

	ctx := context.Background()
	nft := func(args ...string) {
		t.Helper()
		if out, err := h.p.Node2.Run(ctx, append([]string{"nft"}, args...)...); err != nil {
			t.Fatalf("nft %v on node2: %v\n%s", args, err, out)
		}
	}
	tr := testbed.StartFailoverTraffic(h.p, 12*time.Second)
	if !waitFor(20*time.Second, func() bool { return time.Since(tr.Start) > 2*time.Second }) {
		t.Fatal("unreachable")
	}
	nft("add", "table", "inet", "sstvrrp")
	nft("add", "chain", "inet", "sstvrrp", "in", "{ type filter hook input priority 0 ; }")
	nft("add", "rule", "inet", "sstvrrp", "in", "ip", "protocol", "vrrp", "drop")
	if !waitFor(haTakeoverBound, func() bool {
		return strings.Contains(n1.mustEspctl("pair", "status"), "role active") &&
			strings.Contains(n2.mustEspctl("pair", "status"), "role active")
	}) {
		t.Fatalf("no split brain: node1 %s; node2 %s", n1.mustEspctl("pair", "status"), n2.mustEspctl("pair", "status"))
	}
	followed := func() bool {
		return strings.Contains(n1.espd.Log(), "continues above the other active node") ||
			strings.Contains(n2.espd.Log(), "continues above the other active node")
	}
	if !waitFor(20*time.Second, followed) {
		t.Errorf("neither espd followed the other's reservations:\n%s\n%s",
			grepLines(n1.espd.Log(), 20, "component=pair"), grepLines(n2.espd.Log(), 20, "component=pair"))
	}
	tr.Wait(t)
	replies := len(testbed.PingReplyRE.FindAllString(tr.PingOut, -1))
	t.Logf("during the split: %d of %d echo requests answered, transfer %v (err %v); peer %s",
		replies, tr.Count, tr.Xfer, tr.XferErr, peer.stats().saLine(peerChild.SPIIn))

	nft("delete", "table", "inet", "sstvrrp")
	if !waitFor(haTakeoverBound, func() bool { return strings.Contains(n2.mustEspctl("pair", "status"), "role standby") }) {
		t.Errorf("node2 after the split: %s", n2.mustEspctl("pair", "status"))
	}
	tr = testbed.StartFailoverTraffic(h.p, 6*time.Second)
	tr.Wait(t)
	t.Logf("after the split: %d of %d echo requests answered; node1's IKE_SA %q", len(testbed.PingReplyRE.FindAllString(tr.PingOut, -1)), tr.Count, n1.ikeState())
	caps.Check(t)
}

// TestHADocConfigs: docs/ha.md's configuration is the tests': its
// keepalived.conf is node 1's of testbed.KeepalivedConf with the options
// the tests use (the FIFO and script at the page's paths, the checks of
// espd and charon), its
// swanctl.conf the connection the site-to-site tests build (the peer's is
// its mirror), and its espd drop-in the packaged espd-ike.service command
// with the pair's flags TestHAPair gives node 1. The notify script, the
// ha plugin's section and swanctl.conf are run as written by TestHAPair.
func TestHADocConfigs(t *testing.T) {
	norm := func(s string) string {
		var out []string
		for _, l := range strings.Split(s, "\n") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
		return strings.Join(out, "\n")
	}
	want := testbed.KeepalivedConf("node1", testbed.KeepalivedOptions{Priority: 150, NoPreempt: true, AdvertInt: "0.2",
		NotifyFIFO: "/run/keepalived-pair.fifo", NotifyScript: "/usr/local/sbin/espd-pair-notify", Checks: haChecks})
	if got := haDoc(t, "conf", "ha keepalived"); norm(got) != norm(want) {
		t.Errorf("docs/ha.md's keepalived.conf is not the tests':\n%s\nwant:\n%s", got, want)
	}
	pairConn, _ := v4("aes128gcm16")
	conns, _, _ := strings.Cut(pairConn.String(), "secrets {")
	if got := haDoc(t, "conf", "ha swanctl"); norm(got) != norm(conns) {
		t.Errorf("docs/ha.md's swanctl.conf is not the tests':\n%s\nwant:\n%s", got, conns)
	}
	secrets, _ := testbed.RunSecretBlock(t, haDoc(t, "sh", "ha swanctl secret"))
	_, wantSecrets, _ := strings.Cut(pairConn.String(), "secrets {")
	strip := regexp.MustCompile(`secret = \S+`)
	if a, b := strip.ReplaceAllString(norm(secrets), "secret"), strip.ReplaceAllString(norm("secrets {"+wantSecrets), "secret"); a != b {
		t.Errorf("docs/ha.md's secret block makes secrets for other identities than the tests':\n%s\nwant:\n%s", a, b)
	}
	unit, err := os.ReadFile("../../packaging/systemd/espd-ike.service")
	if err != nil {
		t.Fatal(err)
	}
	var base string
	for _, l := range strings.Split(string(unit), "\n") {
		if strings.HasPrefix(l, "ExecStart=") {
			base = strings.TrimPrefix(l, "ExecStart=")
		}
	}
	var cmd string
	for _, l := range strings.Split(haDoc(t, "ini", "ha espd"), "\n") {
		if strings.HasPrefix(l, "ExecStart=") {
			cmd = strings.TrimPrefix(l, "ExecStart=")
		}
	}
	rest, ok := strings.CutPrefix(cmd, base+" ")
	if base == "" || !ok {
		t.Fatalf("docs/ha.md's ExecStart %q does not extend the packaged %q", cmd, base)
	}
	if want := strings.Join(haEspdFlags(0, "/etc/espd/keys/pair.key", "/var/lib/espd-pair/role"), " "); rest != want {
		t.Errorf("docs/ha.md's espd flags %q, the tests' %q", rest, want)
	}
}
