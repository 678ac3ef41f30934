package e2e

import (
	"context"
	"crypto/rand"
	"fmt"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// TestInjection captures real ESP packets from gwA to gwB on the transit
// link and sends, from gwA's namespace, copies of them (replays), copies
// with one byte flipped (tampered), and ESP with an SPI gwB does not know,
// while a transfer runs beside them. gwB must drop each kind and count it
// under the matching counter, and the transfer must complete with a
// matching hash.
func TestInjection(t *testing.T) {
	for _, c := range []struct {
		outer testbed.Family
		encap bool
	}{
		{testbed.IPv4, false},
		{testbed.IPv6, true},
	} {
		name := fmt.Sprintf("outer-%s-%s", c.outer, map[bool]string{false: "esp", true: "udp4500"}[c.encap])
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			tn := newTunnel(t, tunnelOpts{outer: c.outer, encap: c.encap, inner: []testbed.Family{testbed.IPv4}, replayWindow: 64})
			injection(t, ctx, tn)
		})
	}
}

func injection(t *testing.T, ctx context.Context, tn *tunnel) {
	const n = 3 // packets of each kind
	capt, err := tn.top.GwB.StartCapture(testbed.IfTransit, testbed.CaptureOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := tn.top.Client.Ping(ctx, serverAddr(testbed.IPv4), testbed.PingOptions{Count: 2 * n, Interval: 50 * time.Millisecond})
	if err != nil || !r.OK() {
		capt.Stop()
		t.Fatalf("ping: %+v %v", r, err)
	}
	res, err := capt.Stop()
	if err != nil {
		t.Fatal(err)
	}
	var orig []testbed.Frame
	for _, f := range res.Frames {
		if !f.Outgoing && f.SPI == spiAB && f.ESP() != nil {
			orig = append(orig, f)
		}
	}
	if len(orig) < 2*n {
		t.Fatalf("captured %d ESP packets from gwA, want %d (%s)", len(orig), 2*n, res.Summary())
	}
	replayBefore := tn.b.saCounter(t, spiAB, tn.bOuter, cntReplay...)
	integBefore := tn.b.saCounter(t, spiAB, tn.bOuter, cntIntegrity...)
	spiBefore := tn.b.globalCounter(t, cntInvalidSPI...)
	if integBefore != 0 {
		t.Errorf("integrity failures before any tampering: %d", integBefore)
	}

	// Forge the packets first, so that the injection is quick.
	var replays, tampered, unknown [][]byte
	for i := range n {
		replays = append(replays, orig[i].IP())
		// Flip the top bit of the sequence number: the packet now lies
		// ahead of the replay window, so only its ICV can reject it. The
		// outer headers are built again (a UDP checksum would not match).
		esp := append([]byte(nil), orig[n+i].ESP()...)
		esp[4] ^= 0x80
		tampered = append(tampered, forge(t, tn, esp))
		body := make([]byte, 64)
		rand.Read(body)
		unknown = append(unknown, forge(t, tn, testbed.BuildESP(0xdead0000+uint32(i), 1, body)))
	}

	// A transfer beside the injections.
	type result struct {
		r   testbed.TransferResult
		err error
	}
	done := make(chan result, 1)
	// Paced to 200 Mbit/s, about 0.3 s: espd is not saturated, so what it
	// drops it drops for the reasons counted below.
	go func() {
		r, err := pacedTransfer(t, ctx, tn.top, testbed.IPv4, true, 8<<20, 25e6)
		done <- result{r, err}
	}()
	time.Sleep(50 * time.Millisecond)
	for i := range n {
		for _, p := range [][]byte{replays[i], tampered[i], unknown[i]} {
			if err := tn.top.GwA.InjectIP(p); err != nil {
				t.Fatal(err)
			}
		}
	}
	injectedAt := time.Now()
	tr := <-done
	if tr.err != nil {
		t.Fatalf("transfer beside the injections: %v", tr.err)
	}
	t.Logf("injections done %v before the transfer ended", time.Since(injectedAt).Round(time.Millisecond))

	var replay, integ, badSPI uint64
	ok := eventually(5*time.Second, func() bool {
		replay = tn.b.saCounter(t, spiAB, tn.bOuter, cntReplay...) - replayBefore
		integ = tn.b.saCounter(t, spiAB, tn.bOuter, cntIntegrity...) - integBefore
		badSPI = tn.b.globalCounter(t, cntInvalidSPI...) - spiBefore
		return replay >= n && integ >= n && badSPI >= n
	})
	t.Logf("gwB counted %d replays, %d integrity failures, %d unknown SPIs (injected %d of each)", replay, integ, badSPI, n)
	if !ok {
		t.Errorf("gwB: replay +%d, integrity +%d, invalid SPI +%d; want at least %d each (gwB queue drops %d, socket drops %v)",
			replay, integ, badSPI, n, tn.b.globalCounter(t, "global", "queue_drops"), socketDrops(t, ctx, tn.top.GwB))
	}
	// Nothing else produces integrity failures or unknown SPIs here.
	if integ != n || badSPI != n {
		t.Errorf("gwB counted %d integrity failures and %d unknown SPIs for %d injected of each", integ, badSPI, n)
	}
	// And the tunnel still works.
	ping(t, ctx, tn.top, testbed.IPv4, false)
	tn.b.alive(t)
}

// forge wraps an ESP packet in the tunnel's outer headers from gwA to gwB
// (raw or UDP-encapsulated, as the tunnel is).
func forge(t *testing.T, tn *tunnel, esp []byte) []byte {
	t.Helper()
	proto, payload := uint8(50), esp
	if tn.o.encap {
		u, err := testbed.BuildUDP(tn.aOuter, tn.bOuter, testbed.EncapPort, testbed.EncapPort, esp)
		if err != nil {
			t.Fatal(err)
		}
		proto, payload = 17, u
	}
	p, err := testbed.BuildIP(tn.aOuter, tn.bOuter, proto, payload)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
