package testbed

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// pingThrough requires that the client reaches the server (IPv4 and IPv6)
// through whichever node holds the virtual addresses, retrying (bounded)
// while the neighbours learn where they went.
func pingThrough(t *testing.T, p *Pair, when string) {
	t.Helper()
	for _, dst := range []string{ServerV4.Addr().String(), ServerV6.Addr().String()} {
		var r PingResult
		ok := Poll(20*time.Second, 100*time.Millisecond, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var err error
			r, err = p.Client.Ping(ctx, mustAddr(dst), PingOptions{Count: 2, Interval: 100 * time.Millisecond, Wait: time.Second})
			return err == nil && r.OK()
		})
		if !ok {
			t.Fatalf("%s: the client does not reach %s:\n%s", when, dst, r.Output)
		}
	}
}

// TestPairVRRP: keepalived moves the pair's virtual addresses. The node of
// higher priority takes them; with its links cut the other takes them
// and the client reaches the server through it; with its links back the
// first takes them back (preemption), and keepalived stopped with SIGTERM
// releases them.
func TestPairVRRP(t *testing.T) {
	p := NewPairT(t)
	p.RouteLANs(t)
	dir := t.TempDir()
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range p.Nodes() {
				b, _ := os.ReadFile(filepath.Join(dir, "keepalived-"+n.Role+".log"))
				t.Logf("keepalived on %s:\n%s", n.Role, Tail(string(b), 40))
			}
		}
	})
	k1 := StartKeepalived(t, p.Node1, dir, KeepalivedConf("node1", KeepalivedOptions{Priority: 150, AdvertInt: "0.2"}))
	StartKeepalived(t, p.Node2, dir, KeepalivedConf("node2", KeepalivedOptions{Priority: 100, AdvertInt: "0.2"}))
	vips := []string{GwATransitV4.Addr().String(), GwALANV4.Addr().String(), GwATransitV6.Addr().String(), GwALANV6.Addr().String()}
	holders := func(want *Node, when string) {
		t.Helper()
		for _, a := range vips {
			if ok, h := WaitHeldBy(p.Nodes(), want, a, 30*time.Second); !ok {
				t.Fatalf("%s: %s held by %v, want %s alone", when, a, h, want.Role)
			}
		}
	}
	holders(p.Node1, "at start")
	pingThrough(t, p, "node1 active")

	p.Cut(t, p.Node1, true)
	cut := time.Now()
	holders(p.Node2, "node1's links cut")
	pingThrough(t, p, "node2 active")
	t.Logf("node2 took over and the client reached the server %v after node1's links were cut", time.Since(cut).Round(time.Millisecond))

	p.Cut(t, p.Node1, false)
	holders(p.Node1, "node1's links back")
	pingThrough(t, p, "node1 active again")

	if err := k1.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	holders(p.Node2, "node1's keepalived stopped")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, a := range vips {
		if p.Node1.HoldsAddr(ctx, a) {
			t.Errorf("node1 kept %s after its keepalived stopped", a)
		}
	}
}
