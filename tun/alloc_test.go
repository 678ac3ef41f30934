//go:build !race

package tun_test

import (
	"net/netip"
	"testing"

	"github.com/espd/espd/testbed"
	"github.com/espd/espd/tun"
)

// TestWriteNoAllocs writes batches of datagrams written alone and a TCP
// run coalesced into a super-packet, on both paths, and checks that the
// steady state allocates nothing. (Not under the race detector, which
// allocates on its own.)
func TestWriteNoAllocs(t *testing.T) {
	forEachPath(t, func(t *testing.T, noURing bool) {
		ns := testbed.NewNodeT(t, "tun")
		dev := createPath(t, ns, tun.Config{Name: "esptest10"}, noURing)
		// Forwarding is off: the kernel drops what arrives, after Write.
		src, dst := netip.MustParseAddr("198.18.115.2"), netip.MustParseAddr("198.18.116.2")
		const off = 16
		var tmpl [][]byte
		for i := range 16 {
			tmpl = append(tmpl, withOffset(off, udp4(src, dst, 40000, uint16(5000+i), 17, []byte("no allocs"))))
		}
		for i := range 8 {
			tmpl = append(tmpl, withOffset(off, tcpPkt(src, dst, uint32(1000+300*i), 0x10, make([]byte, 300))))
		}
		bufs := make([][]byte, len(tmpl))
		for i := range bufs {
			bufs[i] = make([]byte, len(tmpl[i]))
		}
		write := func() {
			for i := range bufs {
				copy(bufs[i], tmpl[i]) // Write changed the super-packet's head
			}
			if err := dev.Write(bufs, off); err != nil {
				t.Fatal(err)
			}
		}
		write()
		before := dev.Stats()
		if allocs := testing.AllocsPerRun(100, write); allocs != 0 {
			t.Errorf("%.2f allocations per Write of %d packets, want 0", allocs, len(bufs))
		}
		after := dev.Stats()
		checkWrites(t, before, after, 101*17, 101, 101*24)
		checkEnters(t, before, after, noURing, 101)
	})
}
