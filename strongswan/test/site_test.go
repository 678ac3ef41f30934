package strongswantest

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

const testSecond = time.Second

// transferBytes is the size of the bulk transfers that check the tunnels.
const transferBytes = 20 << 20

// transfer sends n bytes over TCP from one host to another and checks the
// SHA-256 of what arrived.
func transfer(t *testing.T, from, to *testbed.Node, dst testbed.Family, n int64, rate uint64) testbed.TransferResult {
	t.Helper()
	addr := testbed.Pick(dst, testbed.ServerV4, testbed.ServerV6).Addr()
	if to.Role == "client" {
		addr = testbed.Pick(dst, testbed.ClientV4, testbed.ClientV6).Addr()
	}
	res, err := testbed.Transfer(context.Background(), testbed.TransferOptions{
		From: from, To: to, Dst: addr, Bytes: n, Timeout: 90 * time.Second, Seed: uint64(n), MaxRate: rate,
	})
	if err != nil {
		t.Fatalf("transfer %s -> %s (%v): %v (%v)", from.Role, to.Role, addr, err, res)
	}
	t.Logf("transfer %s -> %s %v: %v", from.Role, to.Role, addr, res)
	return res
}

// checkEmpty checks what a terminate with the connection still loaded
// leaves in espd: no states, and only the outbound policies, kept as drop
// policies (docs/safety.md, "Under charon"); then it unloads every
// connection of g's charon and checks that the plugin deletes those too:
// no policies and no routes into the TUN left.
func checkEmpty(t *testing.T, g *gateway) {
	t.Helper()
	ok := waitFor(5*time.Second, func() bool {
		s := g.espdSPIs()
		return len(s["in"]) == 0 && len(s["out"]) == 0 && g.espdPolicies() == g.espdPoliciesKept()
	})
	if !ok || g.espdPoliciesKept() == 0 {
		t.Errorf("%s: after the terminate espd has more than its kept outbound drop policies, or none:\n%s\n%s", g.name,
			g.mustEspctl("sa", "list"), g.mustEspctl("policy", "list"))
	}
	g.load("")
	ok = waitFor(10*time.Second, func() bool {
		s := g.espdSPIs()
		return len(s["in"]) == 0 && len(s["out"]) == 0 && g.espdPolicies() == 0 && g.tunnelRoutes() == ""
	})
	if !ok {
		t.Errorf("%s: espd still has state after the connections were unloaded:\n%s\n%s\nroutes:\n%s", g.name,
			g.mustEspctl("sa", "list"), g.mustEspctl("policy", "list"), g.tunnelRoutes())
	}
}

// TestSiteToSite brings a PSK site-to-site tunnel up for each cipher,
// moves 20 MB through it, checks the counters charon shows and tears it
// down again with swanctl --terminate.
func TestSiteToSite(t *testing.T) {
	requireStrongSwan(t)
	p := newPair(t, pairOptions{})
	for _, suite := range []string{"aes128gcm16", "aes256gcm16", "chacha20poly1305", "aes256-sha256"} {
		t.Logf("--- %s", suite)
		p.load(v4(suite))
		p.initiate()

		// espd got the negotiated transform in both directions.
		for _, g := range []*gateway{p.a, p.b} {
			spis := g.espdSPIs()
			if len(spis["in"]) != 1 || len(spis["out"]) != 1 {
				t.Fatalf("%s %s: espd states %v, want one per direction", suite, g.name, spis)
			}
			if out := g.mustEspctl("sa", "list"); strings.Count(out, "alg "+suite+" ") != 2 {
				t.Fatalf("%s %s: espd's states do not use %s:\n%s", suite, g.name, suite, out)
			}
			c, _ := g.installedChild("net")
			if c.SPIIn != spis["in"][0] || c.SPIOut != spis["out"][0] {
				t.Fatalf("%s %s: charon's SPIs %s/%s, espd's %v", suite, g.name, c.SPIIn, c.SPIOut, spis)
			}
			// charon's keys are marked negotiated (their sequence-number
			// records may expire once they are gone).
			if out := g.mustEspctl("sa", "list"); strings.Count(out, "keying negotiated\n") != 2 || strings.Contains(out, "keying manual") {
				t.Fatalf("%s %s: the plugin's states are not both marked negotiated:\n%s", suite, g.name, out)
			}
		}
		// An SA added by espctl in the same run is manual.
		checkManualBesideCharon(t, p.a)
		if n := p.a.tunnelRoutes(); !strings.Contains(n, testbed.LANBV4.String()) {
			t.Fatalf("%s: no route to %v into the TUN on A: %q", suite, testbed.LANBV4, n)
		}

		transfer(t, p.topo.Client, p.topo.Server, testbed.IPv4, transferBytes, 0)

		// charon reads espd's counters: swanctl shows the bytes.
		ca, _ := p.a.installedChild("net")
		cb, _ := p.b.installedChild("net")
		t.Logf("%s: A out %d bytes %d packets, in %d bytes; B in %d bytes %d packets", suite,
			ca.BytesOut, ca.PacketsOut, ca.BytesIn, cb.BytesIn, cb.PacketsIn)
		if ca.BytesOut < transferBytes || cb.BytesIn < transferBytes || ca.BytesIn == 0 || cb.BytesOut == 0 {
			t.Fatalf("%s: swanctl --list-sas counters too small: A %+v B %+v", suite, ca, cb)
		}
		if ca.BytesOut != cb.BytesIn && ca.BytesOut < cb.BytesIn {
			t.Fatalf("%s: B received %d bytes, more than A sent (%d)", suite, cb.BytesIn, ca.BytesOut)
		}
		if listed := p.a.mustSwanctl("--list-sas"); !strings.Contains(listed, "bytes") {
			t.Fatalf("%s: swanctl --list-sas shows no counters:\n%s", suite, listed)
		}

		// swanctl --terminate removes states, policies and routes from both
		// espds.
		p.a.mustSwanctl("--terminate", "--ike", "s2s", "--timeout", "10")
		checkEmpty(t, p.a)
		checkEmpty(t, p.b)
	}
}

// checkManualBesideCharon adds an outbound SA with espctl next to charon's
// (a key file, never the command line), checks that espd shows it as
// manually keyed while charon's stay negotiated, and deletes it.
func checkManualBesideCharon(t *testing.T, g *gateway) {
	t.Helper()
	keyFile := filepath.Join(g.dir, "manual.key")
	if err := os.WriteFile(keyFile, []byte("0123456789abcdef0123456789abcdef01234567\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(keyFile)
	const spi = "0x00000777"
	g.mustEspctl("sa", "add", "--spi", spi, "--dir", "out", "--src", "198.18.255.1", "--dst", "198.18.255.2",
		"--reqid", "777", "--enc", "aes128gcm16", "--enc-key-file", keyFile)
	show := g.mustEspctl("sa", "get", "--spi", spi, "--dst", "198.18.255.2")
	if !strings.Contains(show, "keying manual\n") || strings.Contains(show, "keying negotiated") {
		t.Errorf("%s: the SA espctl added is not manual:\n%s", g.name, show)
	}
	if out := g.mustEspctl("sa", "list"); strings.Count(out, "keying negotiated\n") != 2 || strings.Count(out, "keying manual\n") != 1 {
		t.Errorf("%s: want charon's two states negotiated and espctl's manual:\n%s", g.name, out)
	}
	g.mustEspctl("sa", "del", "--spi", spi, "--dst", "198.18.255.2")
}

// TestTrap installs the connection with start_action = trap: espd holds
// the trap policies without states, and the first packet's acquire brings
// the tunnel up.
func TestTrap(t *testing.T) {
	requireStrongSwan(t)
	p := newPair(t, pairOptions{})
	a, b := v4("aes128gcm16")
	a.StartAction = "trap"
	p.load(a, b)

	if !waitFor(5*time.Second, func() bool { return p.a.espdPolicies() >= 2 }) {
		t.Fatalf("A: trap policies not in espd:\n%s", p.a.mustEspctl("policy", "list"))
	}
	if spis := p.a.espdSPIs(); len(spis["in"])+len(spis["out"]) != 0 {
		t.Fatalf("A: states before any traffic: %v", spis)
	}
	if r := p.a.tunnelRoutes(); !strings.Contains(r, testbed.LANBV4.String()) {
		t.Fatalf("A: trap policy without a route into the TUN: %q", r)
	}

	// The first packets raise the acquire; the tunnel comes up.
	ctx := context.Background()
	first, err := p.topo.Client.Ping(ctx, testbed.ServerV4.Addr(), testbed.PingOptions{Count: 10, Interval: 200 * time.Millisecond, Wait: time.Second})
	if err != nil && first.Received == 0 {
		t.Logf("first pings: %v", err)
	}
	t.Logf("pings while the tunnel came up: %d of %d answered", first.Received, first.Transmitted)
	p.a.waitChild("net", 15*time.Second)
	if p.a.charonLogCount("acquire") == 0 {
		t.Errorf("A: charon logged no acquire")
	}
	res, err := p.topo.Client.Ping(ctx, testbed.ServerV4.Addr(), testbed.PingOptions{Count: 5})
	if err != nil || !res.OK() {
		t.Fatalf("pings through the tunnel after the acquire: %v\n%s", err, res.Output)
	}
	transfer(t, p.topo.Client, p.topo.Server, testbed.IPv4, 4<<20, 0)

	// The trap stays when the tunnel goes: terminating the IKE_SA leaves
	// the trap policies, not the states.
	p.a.mustSwanctl("--terminate", "--ike", "s2s", "--timeout", "10")
	if !waitFor(5*time.Second, func() bool { s := p.a.espdSPIs(); return len(s["in"])+len(s["out"]) == 0 }) {
		t.Fatalf("A: states left after terminate: %v", p.a.espdSPIs())
	}
	if p.a.espdPolicies() < 2 {
		t.Fatalf("A: trap policies gone after terminate:\n%s", p.a.mustEspctl("policy", "list"))
	}
	p.a.mustSwanctl("--uninstall", "--child", "net")
	checkEmpty(t, p.a)
}

// TestWithoutHandoff: without the IKE hand-off charon's socket-default
// keeps UDP 500 and 4500 (its IKE sockets marked to bypass espd's table)
// and espd carries raw ESP.
func TestWithoutHandoff(t *testing.T) {
	requireStrongSwan(t)
	p := newPair(t, pairOptions{A: charonOptions{NoHandoff: true}, B: charonOptions{NoHandoff: true}})
	p.load(v4("aes128gcm16"))
	p.initiate()
	if c, _ := p.a.installedChild("net"); c.Encap {
		t.Fatalf("UDP encapsulation without a NAT")
	}
	capA, err := p.topo.GwA.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 96})
	if err != nil {
		t.Fatal(err)
	}
	transfer(t, p.topo.Client, p.topo.Server, testbed.IPv4, 8<<20, 0)
	p.a.mustSwanctl("--rekey", "--child", "net")
	if !waitFor(10*time.Second, func() bool { return p.a.charonLogCount("CHILD_SA net{2} established") > 0 }) {
		t.Fatalf("rekey over charon's own sockets failed")
	}
	res, err := capA.Stop()
	if err != nil {
		t.Fatal(err)
	}
	counts := res.Counts()
	t.Logf("A's transit link: %s", res.Summary())
	var espBytes int
	for _, f := range res.Frames {
		if f.Class == testbed.ClassESP {
			espBytes += f.Len
		}
	}
	if espBytes < 8<<20 || counts[testbed.ClassESPInUDP] != 0 {
		t.Errorf("want raw ESP only: %s", res.Summary())
	}
	if counts[testbed.ClassIKE] == 0 {
		t.Errorf("the rekey's IKE exchange did not cross the transit link")
	}
	if !strings.Contains(p.a.charon.Log(), "cannot reach espd") {
		t.Errorf("A: the plugin did not explain that ESP-in-UDP on charon's port cannot reach espd")
	}
	p.a.mustSwanctl("--terminate", "--ike", "s2s", "--timeout", "10")
	checkEmpty(t, p.a)
	checkEmpty(t, p.b)
}

// TestWithoutHandoffPortClash follows the no-hand-off setup but starts espd
// with its default ESP-in-UDP port, 4500, which is charon's NAT-T port:
// socket-default cannot open it ("could not open IPv4 NAT-T socket"), and
// the plugin must say why, naming the port and the fix.
func TestWithoutHandoffPortClash(t *testing.T) {
	requireStrongSwan(t)
	p := newPair(t, pairOptions{A: charonOptions{NoHandoff: true}, B: charonOptions{NoHandoff: true},
		EspdA: []string{"--udp-port", "4500"}})
	if !waitFor(5*time.Second, func() bool { return p.a.charonLogCount("could not open IPv4 NAT-T socket") > 0 }) {
		t.Fatalf("A: charon opened its NAT-T socket although espd holds UDP 4500")
	}
	if !waitFor(5*time.Second, func() bool {
		return p.a.charonLogCount("espd: charon could not open its NAT-T port UDP 4500", "--udp-port 4501") > 0
	}) {
		t.Fatalf("A: the plugin did not name the port clash")
	}
	if n := p.b.charonLogCount("espd: charon could not open its NAT-T port"); n != 0 {
		t.Errorf("B (espd on --udp-port 4501): the plugin reported a port clash %d times", n)
	}
}
