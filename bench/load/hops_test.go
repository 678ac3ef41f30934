package load

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// TestFollowEchoes follows requests through synthetic captures of an ESP
// tunnel: the hops add up to the round trip, keepalives and IKE on the
// transit link are not taken for the ping, and a request the captures
// missed is left out.
func TestFollowEchoes(t *testing.T) {
	client, server := netip.MustParseAddr("198.18.1.2"), netip.MustParseAddr("198.18.2.2")
	gwA, gwB := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2")
	const id = 0x4242
	echo := func(t *testing.T, reply bool, seq uint16) []byte {
		typ, src, dst := byte(8), client, server
		if reply {
			typ, src, dst = 0, server, client
		}
		p, err := testbed.BuildIP(src, dst, 1, []byte{typ, 0, 0, 0, id >> 8, id & 0xff, byte(seq >> 8), byte(seq), 1, 2, 3, 4})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	esp := func(t *testing.T, src, dst netip.Addr, seq uint32) []byte {
		p, err := testbed.BuildIP(src, dst, 50, testbed.BuildESP(0x1000, seq, make([]byte, 120)))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	udp := func(t *testing.T, src, dst netip.Addr, sport, dport uint16, n int) []byte {
		u, err := testbed.BuildUDP(src, dst, sport, dport, make([]byte, n))
		if err != nil {
			t.Fatal(err)
		}
		p, err := testbed.BuildIP(src, dst, 17, u)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	us := time.Microsecond
	base := time.Unix(1796500000, 0)
	var aLAN, aWAN, bWAN, bLAN []testbed.Frame
	rtt := RTT{ID: id, Each: make([]time.Duration, 3)}
	for seq := range 3 {
		t0 := base.Add(time.Duration(seq) * 20 * time.Millisecond)
		at := func(d time.Duration) time.Time { return t0.Add(d) }
		// Noise on the transit link before the request leaves: a NAT-T
		// keepalive and an IKE message, both ways.
		aWAN = append(aWAN, testbed.ParseFrame(udp(t, gwA, gwB, 4500, 4500, 1), at(10*us), true),
			testbed.ParseFrame(udp(t, gwA, gwB, 500, 500, 200), at(20*us), true))
		bWAN = append(bWAN, testbed.ParseFrame(udp(t, gwA, gwB, 4500, 4500, 1), at(11*us), false),
			testbed.ParseFrame(udp(t, gwA, gwB, 500, 500, 200), at(21*us), false))
		aLAN = append(aLAN, testbed.ParseFrame(echo(t, false, uint16(seq)), at(0), false))
		aWAN = append(aWAN, testbed.ParseFrame(esp(t, gwA, gwB, uint32(seq+1)), at(100*us), true))
		bWAN = append(bWAN, testbed.ParseFrame(esp(t, gwA, gwB, uint32(seq+1)), at(102*us), false))
		if seq == 1 {
			continue // B's LAN capture missed this one
		}
		bLAN = append(bLAN, testbed.ParseFrame(echo(t, false, uint16(seq)), at(202*us), true),
			testbed.ParseFrame(echo(t, true, uint16(seq)), at(232*us), false))
		bWAN = append(bWAN, testbed.ParseFrame(esp(t, gwB, gwA, uint32(seq+1)), at(332*us), true))
		aWAN = append(aWAN, testbed.ParseFrame(esp(t, gwB, gwA, uint32(seq+1)), at(335*us), false))
		aLAN = append(aLAN, testbed.ParseFrame(echo(t, true, uint16(seq)), at(435*us), true))
		rtt.Each[seq] = 500 * us
	}
	hops, err := FollowEchoes(rtt, aLAN, aWAN, bWAN, bLAN)
	if err != nil {
		t.Fatal(err)
	}
	if len(hops) != 2 {
		t.Fatalf("followed %d requests, want 2 (one was not answered)", len(hops))
	}
	want := Hops{AOut: 100 * us, Wire: 5 * us, BIn: 100 * us, Server: 30 * us, BOut: 100 * us, AIn: 100 * us, Client: 65 * us}
	for _, h := range hops {
		if h != want {
			t.Errorf("hops %+v, want %+v", h, want)
		}
		if sum := h.AOut + h.Wire + h.BIn + h.Server + h.BOut + h.AIn + h.Client; sum != 500*us {
			t.Errorf("hops add up to %v, want the round trip 500µs", sum)
		}
	}
	if m := MedianHops(hops); m != want {
		t.Errorf("MedianHops = %+v, want %+v", m, want)
	}
	// An answered request the captures cannot follow counts against it.
	rtt.Each[1] = 500 * us
	rtt.Each = append(rtt.Each, 500*us, 500*us)
	if _, err := FollowEchoes(rtt, aLAN, aWAN, bWAN, bLAN); err == nil || !strings.Contains(err.Error(), "followed 2 of 5") {
		t.Errorf("FollowEchoes with 3 of 5 requests missing = %v, want an error", err)
	}
}

// TestFollowEchoesRouted follows requests over a routed path, where the
// echo itself crosses the transit link.
func TestFollowEchoesRouted(t *testing.T) {
	client, server := netip.MustParseAddr("2001:db8:1::2"), netip.MustParseAddr("2001:db8:2::2")
	us := time.Microsecond
	base := time.Unix(1796500000, 0)
	mk := func(reply bool, d time.Duration, out bool) testbed.Frame {
		typ, src, dst := byte(128), client, server
		if reply {
			typ, src, dst = 129, server, client
		}
		p, err := testbed.BuildIP(src, dst, 58, []byte{typ, 0, 0, 0, 0, 7, 0, 0})
		if err != nil {
			t.Fatal(err)
		}
		return testbed.ParseFrame(p, base.Add(d), out)
	}
	rtt := RTT{ID: 7, Each: []time.Duration{100 * us}}
	hops, err := FollowEchoes(rtt,
		[]testbed.Frame{mk(false, 0, false), mk(true, 60*us, true)},
		[]testbed.Frame{mk(false, 5*us, true), mk(true, 55*us, false)},
		[]testbed.Frame{mk(false, 6*us, false), mk(true, 54*us, true)},
		[]testbed.Frame{mk(false, 10*us, true), mk(true, 50*us, false)})
	if err != nil {
		t.Fatal(err)
	}
	want := Hops{AOut: 5 * us, Wire: 2 * us, BIn: 4 * us, Server: 40 * us, BOut: 4 * us, AIn: 5 * us, Client: 40 * us}
	if len(hops) != 1 || hops[0] != want {
		t.Errorf("hops %+v, want [%+v]", hops, want)
	}
}
