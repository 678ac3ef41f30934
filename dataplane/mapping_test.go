package dataplane

import (
	"net/netip"
	"testing"
	"time"

	"github.com/espd/espd/sa"
)

// TestMappingChange: authentic ESP-in-UDP packets from another address or
// port than the inbound state's peer raise one mapping event (rate
// limited); once the control plane moves the state, none.
func TestMappingChange(t *testing.T) {
	h := newHarness(t, Config{}, false)
	sub := h.db.Subscribe(16)
	defer sub.Close()
	tn := tunnel{reqid: 9, spi: 0x900, dst: netip.MustParsePrefix("198.19.9.0/24"), sport: 4500, dport: 4500}
	_, in := h.add(tn)
	dst := netip.MustParseAddr("198.19.9.9")
	// The harness's outbound packets come from local4:4500, but the inbound
	// state expects its peer, peer4:4500: as if the peer's NAT had moved.
	send := func(first uint64, n int) {
		before := h.tun.count.Load()
		for i := range n {
			h.wire.inject(h.oneOut(udpPacket(innerSrc4, dst, 1, 2, first+uint64(i), 200, false)))
		}
		waitFor(t, "the inner packets", func() bool { return h.tun.count.Load() == before+uint64(n) })
	}
	send(1, 3)
	var events []sa.Event
	collect := func() {
		for {
			select {
			case ev := <-sub.Events():
				if ev.Kind == sa.EventMapping {
					events = append(events, ev)
				}
			case <-time.After(100 * time.Millisecond):
				return
			}
		}
	}
	collect()
	want := netip.AddrPortFrom(local4, 4500)
	if len(events) != 1 || events[0].SPI != 0x900 || events[0].NewPeer != want || events[0].ReqID != 9 {
		t.Fatalf("mapping events %+v, want one for SPI 0x900 with new peer %v", events, want)
	}

	// The control plane updates the state to the new mapping.
	cfg := in.Config()
	cfg.Src = local4
	if err := h.db.UpdateSA(cfg); err != nil {
		t.Fatal(err)
	}
	events = nil
	send(4, 2)
	collect()
	if len(events) != 0 {
		t.Errorf("mapping events after the update: %+v", events)
	}
}
