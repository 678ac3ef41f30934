package tun

import (
	"encoding/binary"
	"testing"

	"github.com/espd/espd/packet"
)

// FuzzCoalesce feeds arbitrary packets (what a peer may put inside ESP)
// to Write's planning and super-packet headers: no input may panic, and a
// group only ever holds candidates of one flow, in order.
func FuzzCoalesce(f *testing.F) {
	seg := func(seq uint32, n int) []byte {
		p := make([]byte, 40+n)
		p[0] = 0x45
		binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
		p[8], p[9] = 64, 6
		copy(p[12:20], []byte{198, 18, 1, 2, 198, 18, 2, 2})
		binary.BigEndian.PutUint16(p[10:], packet.Checksum(p[:20], 0))
		t := p[20:]
		binary.BigEndian.PutUint32(t[4:], seq)
		t[12], t[13] = 5<<4, tcpFlagACK
		binary.BigEndian.PutUint16(t[16:], packet.Checksum(t, pseudoHeaderSum(p[12:20], 6, len(t))))
		return p
	}
	f.Add(seg(1, 100), seg(101, 100), seg(201, 50), 3)
	f.Add(seg(1, 100), []byte{0x60}, seg(101, 100), 2)
	f.Fuzz(func(t *testing.T, a, b, c []byte, dup int) {
		c1 := coalescer{udp: dup%2 == 0}
		pkts := [][]byte{a, b, c, a, b, c}[:3+dup%4]
		bufs := make([][]byte, len(pkts))
		for i, p := range pkts {
			bufs[i] = append(make([]byte, MinWriteOffset), p...)
		}
		c1.plan(bufs, MinWriteOffset)
		for gi := range c1.groups {
			g := &c1.groups[gi]
			n := 0
			for j := g.first; j >= 0; j = c1.next[j] {
				if c1.member[j] != gi {
					t.Fatalf("packet %d in group %d's chain belongs to %d", j, gi, c1.member[j])
				}
				n++
			}
			if n != g.count {
				t.Fatalf("group %d: %d packets chained, count %d", gi, n, g.count)
			}
			if g.count > 1 {
				b := append([]byte(nil), bufs[g.first][MinWriteOffset-vnetHdrLen:]...)
				superHeader(b, g)
			}
		}
	})
}
