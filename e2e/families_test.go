package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// TestFamilies runs IPv4 and IPv6 LAN traffic through an IPv4 and an IPv6
// tunnel, raw and UDP-encapsulated: all four inner/outer combinations, both
// encodings. Each combination carries a ping both ways and 2 MiB each way
// (the 20 MiB transfers are in TestSuites, for IPv4-in-IPv4 raw ESP).
//
// Meanwhile a capture on gwB's transit interface records every frame, and
// the test requires that only ESP (raw) or ESP-in-UDP and NAT keepalives
// (encapsulated), besides ARP and neighbour discovery, crossed: no frame
// may carry an inner address in clear, and the SPIs seen must be the
// tunnel's.
func TestFamilies(t *testing.T) {
	for _, c := range []outerCase{
		{testbed.IPv4, false, "aes256gcm16"},
		{testbed.IPv6, false, "aes128-sha256"},
		{testbed.IPv4, true, "chacha20poly1305"},
		{testbed.IPv6, true, "aes128gcm16"},
	} {
		t.Run(c.name(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			tn := newTunnel(t, tunnelOpts{suite: c.suite, outer: c.outer, encap: c.encap})
			capt, err := tn.top.GwB.StartCapture(testbed.IfTransit, testbed.CaptureOptions{})
			if err != nil {
				t.Fatal(err)
			}
			stopped := false
			defer func() {
				if !stopped {
					capt.Stop()
				}
			}()
			for _, inner := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
				t.Run(describe(inner, c.outer), func(t *testing.T) { pingAndTransfer(t, ctx, tn.top, inner) })
			}
			stopped = true
			res, err := capt.Stop()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("transit capture at gwB: %s", res.Summary())
			logSocketDrops(t, ctx, tn)
			checkTransit(t, res, c.encap, 4*smallTransfer)
		})
	}
}

// outerCase is a tunnel's outer family, framing and suite.
type outerCase struct {
	outer testbed.Family
	encap bool // ESP-in-UDP on port 4500
	suite string
}

// name is the subtest's name: "outer-IPv4-esp", "outer-IPv6-udp4500".
func (c outerCase) name() string {
	return fmt.Sprintf("outer-%s-%s", c.outer, map[bool]string{false: "esp", true: "udp4500"}[c.encap])
}

// pingAndTransfer pings across the tunnel both ways in the family inner,
// then transfers smallTransfer bytes both ways at once.
func pingAndTransfer(t *testing.T, ctx context.Context, top *testbed.Topology, inner testbed.Family) {
	t.Helper()
	ping(t, ctx, top, inner, false)
	ping(t, ctx, top, inner, true)
	var wg sync.WaitGroup
	for _, up := range []bool{true, false} {
		wg.Go(func() {
			if _, err := transferErr(t, ctx, top, inner, up, smallTransfer); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
}

// checkTransit requires a complete capture of the transit link that holds
// only the tunnel's ESP (raw or in UDP, as encap says), at least minBytes
// of it, and no inner address in clear.
func checkTransit(t *testing.T, res *testbed.CaptureResult, encap bool, minBytes int) {
	t.Helper()
	if !res.Complete() {
		t.Errorf("the capture missed frames: %s", res.Summary())
	}
	want := testbed.ClassESP
	if encap {
		want = testbed.ClassESPInUDP
	}
	var espBytes int
	spis := map[uint32]int{}
	shown := 0
	for i := range res.Frames {
		f := &res.Frames[i]
		switch {
		case f.Class == want:
			espBytes += f.Len
			if !f.Fragment || f.FirstFragment {
				spis[f.SPI]++
			}
		case f.Class == testbed.ClassLink:
		case f.Class == testbed.ClassKeepalive && encap:
		default:
			if shown < 10 {
				why := ""
				if unreachableESP(f) {
					why = " (a gateway's kernel answered ESP that no socket took: espd's raw ESP socket was full or missing)"
				}
				t.Errorf("unexpected frame on transit: %s%s", f.String(), why)
			}
			shown++
		}
	}
	if shown > 10 {
		t.Errorf("... %d unexpected frames in all", shown)
	}
	for spi := range spis {
		if spi != spiAB && spi != spiBA {
			t.Errorf("ESP with SPI 0x%x on transit (%d frames)", spi, spis[spi])
		}
	}
	if spis[spiAB] == 0 || spis[spiBA] == 0 {
		t.Errorf("SPIs on transit: %v, want both 0x%x and 0x%x", spis, spiAB, spiBA)
	}
	if espBytes < minBytes {
		t.Errorf("only %d bytes of %s on transit, want at least %d", espBytes, want, minBytes)
	}
	inner := []netip.Addr{clientAddr(testbed.IPv4), serverAddr(testbed.IPv4), clientAddr(testbed.IPv6), serverAddr(testbed.IPv6)}
	if leaks := res.Leaks(inner...); len(leaks) > 0 {
		for i, f := range leaks {
			if i == 10 {
				break
			}
			t.Errorf("cleartext on transit: %s", f.String())
		}
		t.Errorf("%d frames on transit show inner addresses", len(leaks))
	}
}

// unreachableESP reports whether f is an ICMP protocol unreachable (IPv4)
// or an ICMPv6 parameter problem "unrecognized next header" about ESP.
func unreachableESP(f *testbed.Frame) bool {
	ip := f.IP()
	switch {
	case f.Proto == 1 && f.SrcPort == 3 && f.DstPort == 2:
		return len(ip) >= 20+8+20 && ip[20+8+9] == 50
	case f.Proto == 58 && f.SrcPort == 4 && f.DstPort == 1:
		return len(ip) >= 40+8+40 && ip[40+8+6] == 50
	}
	return false
}

// logSocketDrops logs what the kernel dropped on both gateways' outer
// sockets.
func logSocketDrops(t *testing.T, ctx context.Context, tn *tunnel) {
	t.Helper()
	t.Logf("outer socket drops: gwA %v, gwB %v", socketDrops(t, ctx, tn.top.GwA), socketDrops(t, ctx, tn.top.GwB))
}
