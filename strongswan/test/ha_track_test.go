package strongswantest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// docs/ha.md's keepalived checks of espd and charon, as the page gives them
// (at the packaged paths of espctl and swanctl).
const (
	haCheckEspd   = "/usr/bin/espctl --timeout 1s pair status"
	haCheckCharon = "/usr/sbin/swanctl --stats"
)

// haChecks are the checks of docs/ha.md's keepalived configuration.
var haChecks = []testbed.KeepalivedCheck{{Name: "espd", Script: haCheckEspd}, {Name: "charon", Script: haCheckCharon}}

// haKeepalivedConf returns docs/ha.md's keepalived.conf as written, made
// node n's: its router_id and priority, the notify FIFO and script at
// fifo and script, and the checks' espctl and swanctl replaced by shims in
// n's directory. The shims run the real espctl and swanctl against this
// node's espd and charon, whose control sockets are in the node's
// directory (the packaged paths would be shared by all the namespaces of
// the host), with the page's arguments, and exit with their status.
func haKeepalivedConf(t *testing.T, n *haNode, priority int, fifo, script string) string {
	t.Helper()
	bin := filepath.Join(n.dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	shims := map[string]string{
		"espctl": fmt.Sprintf("#!/bin/sh\nexec %q -s %q \"$@\"\n", espctlBin, n.sock),
		"swanctl": fmt.Sprintf("#!/bin/sh\nexport STRONGSWAN_CONF=%q\nexec swanctl \"$@\" --uri %q\n",
			filepath.Join(n.dir, "swanctl-strongswan.conf"), "unix://"+n.vici),
	}
	for name, text := range shims {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(text), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	conf := haDoc(t, "conf", "ha keepalived")
	var pairs []string
	for _, r := range [][2]string{
		{"router_id node1", "router_id " + n.name},
		{"priority 150", "priority " + strconv.Itoa(priority)},
		{"/run/keepalived-pair.fifo", fifo},
		{`"/usr/local/sbin/espd-pair-notify"`, strconv.Quote(script)},
		{"/usr/bin/espctl ", filepath.Join(bin, "espctl") + " "},
		{"/usr/sbin/swanctl ", filepath.Join(bin, "swanctl") + " "},
	} {
		if !strings.Contains(conf, r[0]) {
			t.Fatalf("docs/ha.md's keepalived.conf has no %q:\n%s", r[0], conf)
		}
		pairs = append(pairs, r[0], r[1])
	}
	return strings.NewReplacer(pairs...).Replace(conf)
}

// haFirewall loads on both nodes docs/ha.md's firewall lines as written:
// the pair's lines in the input chain of espd's table (the chain as
// docs/firewall.md declares it), and the box's own input chain with policy
// drop that accepts what a single gateway needs (IKE and ESP, ICMP,
// replies) and the pair's lines for the box.
func (h *haPair) haFirewall(t *testing.T) {
	t.Helper()
	rules := "table inet espd {\n  chain input {\n    type filter hook input priority filter - 10; policy accept;\n" +
		haDoc(t, "nft", "ha firewall") + "  }\n}\n" +
		"table inet box {\n  chain input {\n    type filter hook input priority filter; policy drop;\n" +
		"    iif lo accept\n    ct state established,related accept\n    meta l4proto { icmp, ipv6-icmp } accept\n" +
		"    udp dport { 500, 4500 } accept\n    meta l4proto esp accept\n" +
		haDoc(t, "nft", "ha box input") + "  }\n}\n"
	for _, n := range []*haNode{h.node1, h.node2} {
		path := filepath.Join(n.dir, "pair.nft")
		if err := os.WriteFile(path, []byte(rules), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := n.node.Run(context.Background(), "nft", "-f", path); err != nil {
			t.Fatalf("%s: nft -f docs/ha.md's rules: %v\n%s\n%s", n.name, err, out, rules)
		}
	}
}

// notifiedSince reports whether n's notify script logged, after t0, a line
// containing each of subs.
func (n *haNode) notifiedSince(t0 time.Time, subs ...string) bool {
	for _, l := range strings.Split(n.notifies(), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		sec, err := strconv.ParseFloat(f[0], 64)
		if err != nil || time.Unix(0, int64(sec*1e9)).Before(t0) {
			continue
		}
		all := true
		for _, s := range subs {
			all = all && strings.Contains(l, s)
		}
		if all {
			return true
		}
	}
	return false
}

// TestHATrack: the active node fails over while keepalived lives, when
// only one of its parts dies, through docs/ha.md's keepalived
// configuration as written (haKeepalivedConf: the checks run the page's
// commands through shims that reach this node's espd and charon) and with
// its firewall lines loaded on both nodes beside a box ruleset that drops
// by default: (a) espd killed with SIGKILL and not restarted, (b) charon
// killed, (c) the uplink's carrier lost (the node's transit port on the
// switch set down; LAN and sync links stay up). Each case has a fresh pair
// and, with traffic flowing, requires keepalived's FAULT on the active
// node, the standby holding the addresses and the segment and carrying the
// traffic on (haPair.failover: within haResumeBound, the peer's CHILD_SA
// unchanged, no replay or ICV drop), and in the three transit captures no
// cleartext and no (SPI, sequence number) twice. Then the part comes back:
// the node must stand by again (keepalived left FAULT, espd standing by
// with the active's states) and the traffic go on through the other node
// undisturbed. Not yet for charon: a charon started again beside an espd
// that still holds the killed charon's states has hung after connecting
// to espd (twice in about ten runs; the step is in this file's history), so the
// charon case ends with the failover until that is fixed.
func TestHATrack(t *testing.T) {
	requireHA(t)
	for _, c := range []struct {
		name string
		kill func(t *testing.T, h *haPair)
		// restore brings the part back and returns the CHILD_SA then
		// and whether node1's espd must hold its states (not after an
		// espd restart: see below); nil: the case ends with the failover.
		restore func(t *testing.T, h *haPair, child childSA) (childSA, bool)
	}{
		{"espd", func(t *testing.T, h *haPair) { h.node1.killEspd() },
			func(t *testing.T, h *haPair, child childSA) (childSA, bool) { h.node1.runEspd(); return child, false }},
		{"charon", func(t *testing.T, h *haPair) {
			crashProcess(t, h.node1.charon)
			reapKilled(t, h.node1.charon)
		}, nil},
		{"uplink", func(t *testing.T, h *haPair) { h.p.CutTransit(t, h.node1.node, true) },
			func(t *testing.T, h *haPair, child childSA) (childSA, bool) {
				h.p.CutTransit(t, h.node1.node, false)
				return child, true
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHAPair(t)
			h.haFirewall(t)
			n1, n2 := h.node1, h.node2
			child, caps := h.up(t)
			killed := time.Now()
			h.failover(t, n1, n2, child, func() { c.kill(t, h) })
			if !waitFor(haTakeoverBound, func() bool { return n1.notifiedSince(killed, "start -1", "FAULT") }) {
				t.Fatalf("node1's keepalived did not enter FAULT after its %s died:\n%s", c.name, n1.notifies())
			}
			if c.restore == nil {
				caps.Check(t)
				return
			}
			restored := time.Now()
			child, states := c.restore(t, h, child)
			h.waitStandby(t, restored, child, states)
			tr := testbed.StartFailoverTraffic(h.p, 6*time.Second)
			before := h.peer.stats()
			tr.Wait(t)
			checkTraffic(t, tr, "node1 standing by again", time.Time{}, h.peer, child, before)
			caps.Check(t)
		})
	}
}

// waitStandby waits until node1, its failed part back since t0, stands by
// again: keepalived left FAULT for BACKUP (the notify script ran for it),
// node1's espd stands by and, with states, holds node2's states of the
// CHILD_SA child, and node2 is still active. Without states (espd
// restarted on node1): charon's espd plugin cannot install the states of
// the CHILD_SA again (it keeps no keys, docs/strongswan.md) and charon
// does not replace a CHILD_SA of a PASSIVE IKE_SA, so node1's espd holds
// them again only after the next rekey; that is logged. Other states in
// node1's espd are logged too: after charon was killed, espd keeps the
// states of the CHILD_SA it had installed, which the new charon does not
// know.
func (h *haPair) waitStandby(t *testing.T, t0 time.Time, child childSA, states bool) {
	t.Helper()
	n1, n2 := h.node1, h.node2
	if !waitFor(haTakeoverBound, func() bool { return n1.notifiedSince(t0, "start -1", "BACKUP") }) {
		t.Fatalf("node1 did not stand by again:\n%s", n1.notifies())
	}
	var s1, s2 map[string][]string
	ok := waitFor(haTakeoverBound, func() bool {
		st, err := n1.espctl("pair", "status")
		if err != nil || !strings.Contains(st, "role standby") {
			return false
		}
		s1, s2 = n1.pairSPIs(), n2.pairSPIs()
		if !states {
			return true
		}
		if len(s2["in"]) != 1 || len(s2["out"]) != 1 || s2["out"][0] != child.SPIIn || s2["in"][0] != child.SPIOut {
			return false
		}
		return slices.Contains(s1["in"], child.SPIOut) && slices.Contains(s1["out"], child.SPIIn)
	})
	switch {
	case !states:
		t.Logf("node1's espd restarted: its states %v, node2's %v (the CHILD_SA's come with the next rekey)", s1, s2)
	case fmt.Sprint(s1) != fmt.Sprint(s2):
		t.Logf("node1's espd holds states beyond node2's: %v, node2's %v", s1, s2)
	}
	if !ok {
		st, _ := n1.espctl("pair", "status")
		t.Fatalf("node1 back: espd %s, states %v; node2's %v; the CHILD_SA %s/%s", strings.TrimSpace(st), s1, s2, child.SPIIn, child.SPIOut)
	}
	if st := n2.mustEspctl("pair", "status"); !strings.Contains(st, "role active") || !n2.segmentActive() {
		t.Fatalf("node2 after node1's return: segment active %v, espd %s", n2.segmentActive(), st)
	}
	t.Logf("node1 stands by again: %s", strings.TrimSpace(n1.mustEspctl("pair", "status")))
}

// TestHADocInstall: docs/ha.md's install line names the Debian packages
// that hold what the pair's tests run: keepalived and the ha plugin.
func TestHADocInstall(t *testing.T) {
	requireHA(t)
	f := strings.Fields(haDoc(t, "sh", "ha install"))
	if len(f) < 3 || f[0] != "apt-get" || f[1] != "install" {
		t.Fatalf("docs/ha.md's install block is not one apt-get install: %q", f)
	}
	pkgs := map[string]bool{}
	for _, p := range f[2:] {
		pkgs[p] = true
	}
	for _, file := range []string{testbed.Keepalived, "/usr/lib/ipsec/plugins/libstrongswan-ha.so"} {
		out, err := exec.Command("dpkg", "-S", file).CombinedOutput()
		if err != nil {
			t.Fatalf("dpkg -S %s: %v\n%s", file, err, out)
		}
		pkg, _, _ := strings.Cut(strings.TrimSpace(string(out)), ":")
		if !pkgs[pkg] {
			t.Errorf("%s is in package %s, which docs/ha.md's %q does not install", file, pkg, f)
		}
	}
}
