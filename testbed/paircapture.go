package testbed

import (
	"fmt"
	"net/netip"
	"testing"
)

// PairCaptures are the captures of the transit side of both nodes of a
// Pair and of its peer (GwB), for a whole run.
type PairCaptures struct {
	nodes [2]*Capture
	peer  *Capture
}

// StartPairCaptures starts capturing the three transit sides (snaplen
// 128); the test's clean-up stops them.
func StartPairCaptures(t testing.TB, p *Pair) *PairCaptures {
	t.Helper()
	c := &PairCaptures{}
	var err error
	for i, n := range []*Node{p.Node1, p.Node2} {
		if c.nodes[i], err = n.StartCapture(IfTransit, CaptureOptions{Snaplen: 128}); err != nil {
			t.Fatal(err)
		}
	}
	if c.peer, err = p.GwB.StartCapture(IfTransit, CaptureOptions{Snaplen: 128}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, x := range []*Capture{c.nodes[0], c.nodes[1], c.peer} {
			x.Stop()
		}
	})
	return c
}

// Check stops the captures and requires that the pair sent no (SPI,
// sequence number) twice (as both nodes' transit sides saw their ESP go
// out, and as the peer received it), that the captures lost nothing, and
// that no inner address crossed any of them in clear.
func (c *PairCaptures) Check(t testing.TB) {
	t.Helper()
	vip := GwATransitV4.Addr()
	inner := []netip.Addr{ClientV4.Addr(), ServerV4.Addr(), ClientV6.Addr(), ServerV6.Addr()}
	type key struct{ spi, seq uint32 }
	sent := map[key]string{}
	for i, x := range c.nodes {
		res, err := x.Stop()
		if err != nil {
			t.Fatalf("capture on node%d: %v", i+1, err)
		}
		if !res.Complete() {
			t.Errorf("capture on node%d lost frames: %s", i+1, res.Summary())
		}
		n := 0
		for _, f := range res.Frames {
			if (f.Class == ClassESP || f.Class == ClassESPInUDP) && f.Outgoing && f.Src == vip {
				k := key{f.SPI, f.Seq}
				if prev, dup := sent[k]; dup {
					t.Errorf("node%d sent spi 0x%08x seq %d, which %s had sent", i+1, f.SPI, f.Seq, prev)
				}
				sent[k] = fmt.Sprintf("node%d", i+1)
				n++
			}
		}
		if leaks := res.Leaks(inner...); len(leaks) > 0 {
			t.Errorf("node%d's transit side carried %d cleartext frames, first %v", i+1, len(leaks), leaks[0].String())
		}
		t.Logf("node%d's transit side: %s; %d ESP packets sent from the pair's address", i+1, res.Summary(), n)
	}
	res, err := c.peer.Stop()
	if err != nil {
		t.Fatalf("capture on the peer: %v", err)
	}
	seen := map[key]bool{}
	n := 0
	for _, f := range res.Frames {
		if (f.Class == ClassESP || f.Class == ClassESPInUDP) && !f.Outgoing && f.Src == vip {
			k := key{f.SPI, f.Seq}
			if seen[k] {
				t.Errorf("the peer received spi 0x%08x seq %d twice from the pair", f.SPI, f.Seq)
			}
			seen[k] = true
			n++
		}
	}
	if leaks := res.Leaks(inner...); len(leaks) > 0 {
		t.Errorf("the peer's transit side carried %d cleartext frames, first %v", len(leaks), leaks[0].String())
	}
	if !res.Complete() {
		t.Errorf("capture on the peer lost frames: %s", res.Summary())
	}
	t.Logf("the peer's transit side: %s; %d ESP packets from the pair's address, each (SPI, seq) once; the nodes sent %d", res.Summary(), n, len(sent))
	if n == 0 || len(sent) == 0 {
		t.Error("no ESP from the pair captured")
	}
}
