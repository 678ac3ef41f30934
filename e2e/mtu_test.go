package e2e

import (
	"context"
	"net/netip"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// maxInnerGCM16 is the largest inner packet that fits in one outer packet
// of outerMTU bytes with AES-GCM-16 (8-byte IV, 16-byte ICV, 4-byte
// alignment): outer header, [UDP,] ESP header, IV, payload + pad length +
// next header padded to 4, ICV.
func maxInnerGCM16(outerMTU int, outer testbed.Family, encap bool) int {
	room := outerMTU - testbed.Pick(outer, 20, 40) - 8 - 8 - 16
	if encap {
		room -= 8
	}
	return room/4*4 - 2
}

// udpHeaders is the IP and UDP header length of a datagram.
func udpHeaders(f testbed.Family) int { return testbed.Pick(f, 28, 48) }

// TestPathMTU sends DF packets bigger than the tunnel allows from the
// client and requires the ICMP "fragmentation needed" (IPv4) or "packet too
// big" (IPv6) error to announce an MTU with which a DF packet then crosses
// the tunnel.
//
// tun-mtu: 1500 everywhere; a 1500-byte packet exceeds the TUN's MTU, so
// gwA's kernel answers with the TUN MTU, and a packet of that size must
// fit the tunnel. path-mtu: the transit link has MTU 1400, as has the TUN;
// a 1400-byte packet enters the TUN but cannot be encapsulated within 1400
// bytes, so espd must answer, with the largest inner size that fits (to
// within one 16-byte block).
func TestPathMTU(t *testing.T) {
	t.Run("tun-mtu", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		tn := newTunnel(t, tunnelOpts{outer: testbed.IPv4})
		out, err := tn.top.GwA.IP(ctx, "-o", "link", "show", "dev", tunName)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`mtu (\d+)`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no MTU in %q", out)
		}
		tunMTU, _ := strconv.Atoi(m[1])
		if fit := maxInnerGCM16(1500, testbed.IPv4, false); tunMTU > fit || tunMTU < 1280 {
			t.Fatalf("TUN MTU %d: packets of that size do not fit %d bytes of ESP over 1500, or IPv6 cannot use it", tunMTU, fit)
		}
		for _, f := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
			t.Run(f.String(), func(t *testing.T) {
				probeMTU(t, ctx, tn, f, 1500, tunMTU, tunMTU)
			})
		}
	})
	t.Run("path-mtu", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		tn := newTunnel(t, tunnelOpts{outer: testbed.IPv6, transitMTU: 1400, espdArgs: []string{"--mtu", "1400"}})
		fit := maxInnerGCM16(1400, testbed.IPv6, false)
		for _, f := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
			t.Run(describe(f, testbed.IPv6), func(t *testing.T) {
				probeMTU(t, ctx, tn, f, 1400, fit-16, fit)
			})
		}
	})
}

// probeMTU sends a DF datagram of size bytes from the client to the server,
// requires an ICMP error announcing an MTU in [lo, hi], and then requires a
// DF datagram of that MTU to arrive at the server.
func probeMTU(t *testing.T, ctx context.Context, tn *tunnel, f testbed.Family, size, lo, hi int) {
	t.Helper()
	// The tunnel works at all.
	ping(t, ctx, tn.top, f, false)
	rx, err := tn.top.Server.ListenUDP(netip.AddrPortFrom(serverAddr(f), 0))
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	ie, err := tn.top.Client.ProbePathMTU(ctx, rx.Addr(), size, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ie == nil {
		t.Fatalf("no ICMP error for a %d-byte DF packet", size)
	}
	t.Logf("%d bytes: %v", size, ie)
	wantType := testbed.Pick(f, uint8(3), uint8(2))
	if ie.Type != wantType || ie.MTU < lo || ie.MTU > hi {
		t.Fatalf("%d bytes: %v; want ICMP type %d with an MTU in [%d, %d]", size, ie, wantType, lo, hi)
	}
	if rx.Packets() != 0 {
		t.Errorf("the %d-byte DF packet arrived anyway", size)
	}
	// A DF packet of the announced size crosses.
	for attempt := 0; attempt < 3 && rx.Packets() == 0; attempt++ {
		ie2, err := tn.top.Client.ProbePathMTU(ctx, rx.Addr(), ie.MTU, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if ie2 != nil {
			t.Fatalf("a DF packet of the announced MTU %d got %v", ie.MTU, ie2)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := rx.WaitPackets(wctx, 1); err != nil {
		t.Fatalf("a DF packet of the announced MTU %d did not arrive: %v", ie.MTU, err)
	}
	if sz := rx.Sizes(); sz[0] != ie.MTU-udpHeaders(f) {
		t.Errorf("received %d bytes, want %d", sz[0], ie.MTU-udpHeaders(f))
	}
}
