package dataplane

import (
	"net/netip"
	"testing"

	"github.com/espd/espd/packet"
	"github.com/espd/espd/sa"
)

// TestInterfaces: a route-based interface's packets are matched against its
// own policies only and come back out of it; two interfaces carry the same
// 0/0 selector each to its own state; the policy-based TUN sees none of
// them; a state whose interface ID has no interface drops its packets
// (NoInterface); RemoveInterface stops the interface's reader.
func TestInterfaces(t *testing.T) {
	for _, workers := range []int{0, 4} {
		t.Run(map[int]string{0: "inline", 4: "workers"}[workers], func(t *testing.T) {
			testInterfaces(t, Config{Workers: workers})
		})
	}
}

func testInterfaces(t *testing.T, cfg Config) {
	h := newHarness(t, cfg, true)
	t7, t8 := newFakeTUN(64, 1400), newFakeTUN(64, 1400)
	for id, tn := range map[uint32]*fakeTUN{7: t7, 8: t8} {
		if err := h.d.AddInterface(id, tn); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.d.AddInterface(7, newFakeTUN(64, 1400)); err == nil {
		t.Error("interface 7 added twice")
	}
	if err := h.d.AddInterface(0, newFakeTUN(64, 1400)); err == nil {
		t.Error("interface 0 accepted")
	}
	any4 := netip.MustParsePrefix("0.0.0.0/0")
	out7, _ := h.add(tunnel{reqid: 7, spi: 0x7001, dst: any4, ifID: 7})
	out8, _ := h.add(tunnel{reqid: 8, spi: 0x8001, dst: any4, ifID: 8})
	// The outbound state of interface 9 sends; its inbound twin has an
	// interface ID nobody carries.
	h.add(tunnel{reqid: 9, spi: 0x9001, dst: netip.MustParsePrefix("198.19.9.0/24"), ifID: 7, inIfID: 9})

	dst := netip.MustParseAddr("198.19.50.1")
	t7.in <- [][]byte{udpPacket(innerSrc4, dst, 1, 2, 1, 100, false)}
	t8.in <- [][]byte{udpPacket(innerSrc4, dst, 1, 2, 2, 100, false), udpPacket(innerSrc4, dst, 1, 2, 3, 100, false)}
	waitFor(t, "the packets back out of their interfaces", func() bool {
		return t7.count.Load() == 1 && t8.count.Load() == 2
	})
	if out7.Stats().Packets != 1 || out8.Stats().Packets != 2 {
		t.Errorf("interface 7's state sent %d, 8's %d: want 1 and 2", out7.Stats().Packets, out8.Stats().Packets)
	}
	if c := counterOf(t7.packets()[0]); c != 1 {
		t.Errorf("interface 7 got packet %d", c)
	}

	// The policy-based TUN has no policy for this traffic: dropped,
	// counted, written nowhere.
	before := h.d.Stats().NoPolicy
	h.tun.in <- [][]byte{udpPacket(innerSrc4, dst, 1, 2, 4, 100, false)}
	waitFor(t, "the TUN's packet counted as without policy", func() bool { return h.d.Stats().NoPolicy == before+1 })

	// A state of an interface ID with no interface.
	t7.in <- [][]byte{udpPacket(innerSrc4, netip.MustParseAddr("198.19.9.5"), 1, 2, 5, 100, false)}
	waitFor(t, "the packet of interface 9 counted", func() bool { return h.d.Stats().NoInterface == 1 })

	if err := h.d.RemoveInterface(8); err != nil {
		t.Fatal(err)
	}
	if err := h.d.RemoveInterface(8); err == nil {
		t.Error("interface 8 removed twice")
	}
	select {
	case <-t8.closed:
	default:
		t.Error("RemoveInterface left the TUN open")
	}
	if n := h.tun.count.Load(); n != 0 {
		t.Errorf("the policy-based TUN got %d packets", n)
	}
	f, err := packet.ParseFlow(udpPacket(innerSrc4, dst, 1, 2, 1, 100, false))
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := h.db.LookupPolicy(0, sa.DirOut, f); ok {
		t.Errorf("interface 0 policy %v", p)
	}
}
