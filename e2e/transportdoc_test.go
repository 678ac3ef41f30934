package e2e

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/internal/docblock"
	"github.com/espd/espd/routing"
	"github.com/espd/espd/testbed"
)

// The markers of docs/transport.md's blocks.
const (
	transportKeys      = "transport keys"
	transportHostA     = "transport host A"
	transportHostB     = "transport host B"
	transportFirewallA = "transport firewall A"
)

// transportBlock returns the text of docs/transport.md's one block of
// language lang marked marker.
func transportBlock(t *testing.T, lang, marker string) string {
	t.Helper()
	blocks, err := docblock.Blocks("../docs/transport.md")
	if err != nil {
		t.Fatal(err)
	}
	m := docblock.Marked(blocks, marker)
	if len(m) != 1 || m[0].Lang != lang {
		t.Fatalf("docs/transport.md: want one %s block marked %q, have %+v", lang, marker, m)
	}
	return m[0].Text
}

// TestTransportDoc runs docs/transport.md as written: the keys block once
// (host A's directory, the key files copied to B's), each host's block in
// gwA and gwB of a testbed line (the page's addresses are the transit
// link's), and the firewall on both (B's with the peer's address
// changed). Host A's route shows the locked MTU the page promises. Then
// pings, a TCP transfer each way and 9,216-byte datagrams each way cross,
// the link carries nothing between the hosts but ESP, and a datagram
// forged on the link with B's address in clear never reaches A's socket,
// while the same socket takes B's datagrams through espd.
func TestTransportDoc(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft (nftables)")
	}
	keys := transportBlock(t, "sh", transportKeys)
	blockA, blockB := transportBlock(t, "sh", transportHostA), transportBlock(t, "sh", transportHostB)
	fwA := transportBlock(t, "nft", transportFirewallA)
	top := newTopology(t, 0)
	aAddr, bAddr := testbed.GwATransitV4.Addr(), testbed.GwBTransitV4.Addr()
	if !strings.Contains(blockA, aAddr.String()) || !strings.Contains(blockA, bAddr.String()) {
		t.Fatalf("docs/transport.md's hosts are not the testbed's %v and %v", aAddr, bAddr)
	}
	env := quickStartEnv()
	work := map[string]string{"A": t.TempDir(), "B": t.TempDir()}
	scripts := t.TempDir()
	script := func(name, text string) string {
		p := filepath.Join(scripts, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-e", script("keys.sh", keys))
	cmd.Dir, cmd.Env = work["A"], env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("docs/transport.md's %q block: %v\n%s", transportKeys, err, out)
	}
	for _, f := range []string{"ab.key", "ba.key"} {
		b, err := os.ReadFile(filepath.Join(work["A"], f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(work["B"], f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	outA := runGatewayBlock(t, top.GwA, env, t.TempDir(), t.TempDir(), work["A"], script("host-A.sh", blockA))
	t.Logf("host A, docs/transport.md's %q block:\n%s", transportHostA, outA)
	if !strings.Contains(outA, "src 198.18.0.1 ") || !strings.Contains(outA, "mtu lock 16240") || !strings.Contains(outA, "advmss 1360") {
		t.Errorf("host A's route to B is not the page's (src 198.18.0.1, mtu lock 16240, advmss 1360):\n%s", outA)
	}
	outB := runGatewayBlock(t, top.GwB, env, t.TempDir(), t.TempDir(), work["B"], script("host-B.sh", blockB))
	t.Logf("host B, docs/transport.md's %q block:\n%s", transportHostB, outB)

	fwB := strings.Replace(fwA, "define PEER = "+bAddr.String(), "define PEER = "+aAddr.String(), 1)
	if fwB == fwA {
		t.Fatalf("docs/transport.md's firewall does not define PEER = %v", bAddr)
	}
	loadTransportFirewall(ctx, t, top.GwA, fwA)
	if out, err := top.GwB.Run(ctx, "nft", "-f", script("fw-B.nft", fwB)); err != nil {
		t.Fatalf("nft -f on B: %v\n%s", err, out)
	}

	capt, err := top.GwB.StartCapture(testbed.IfTransit, testbed.CaptureOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	defer func() {
		if !stopped {
			capt.Stop()
		}
	}()
	hostTraffic(t, ctx, top, aAddr, bAddr)
	stopped = true
	res, err := capt.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("transit capture at B: %s", res.Summary())
	checkHostTransit(t, res, false, 2*smallTransfer+2*20*9216, 0x3001, 0x4001)

	// A datagram forged on the link with B's address, in clear, then one
	// from B through espd, to the same socket on A: only the second
	// arrives.
	r, err := top.GwA.ListenUDP(netip.AddrPortFrom(aAddr, 0))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	udp, err := testbed.BuildUDP(bAddr, aAddr, 40000, r.Addr().Port(), []byte("forged in clear"))
	if err != nil {
		t.Fatal(err)
	}
	forged, err := testbed.BuildIP(bAddr, aAddr, 17, udp)
	if err != nil {
		t.Fatal(err)
	}
	if err := top.GwB.InjectIPMarked(forged, routing.DefaultMark); err != nil {
		t.Fatal(err)
	}
	if _, err := top.GwB.SendUDP(ctx, r.Addr(), testbed.UDPSendOptions{Size: 100}); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	if err := r.WaitPackets(wctx, 1); err != nil {
		t.Fatalf("B's datagram through espd did not arrive: %v", err)
	}
	if sizes := r.Sizes(); len(sizes) != 1 || sizes[0] != 100 {
		t.Errorf("A's socket took datagrams of %v bytes, want only B's 100 through espd (the forged one has 15)", sizes)
	}
	if out, _ := top.GwA.Run(ctx, "nft", "list", "chain", "inet", "espd_transport", "input"); !strings.Contains(out, "packets 1 ") {
		t.Errorf("A's firewall did not count the forged datagram:\n%s", out)
	}
}
