package sa

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"

	"github.com/espd/espd/packet"
)

// benchPolicies returns n outbound policies shaped like a gateway's: one
// local /24 to n-1 remote hosts (every 16th a /28), a tenth of them
// port-specific, and a low-priority bypass for the local network.
func benchPolicies(n int) []Policy {
	ps := []Policy{{Selector: Selector{Src: pfx("198.18.0.0/24"), Dst: pfx("198.18.0.0/24")}, Dir: DirOut, Action: ActionBypass, Priority: 100}}
	for i := range n - 1 {
		dst := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)}), 32)
		if i%16 == 0 {
			dst = netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i) &^ 15}), 28)
		}
		p := Policy{Selector: Selector{Src: pfx("198.18.0.0/24"), Dst: dst}, Dir: DirOut, ReqID: uint32(i + 1), Priority: 10}
		if i%10 == 0 {
			p.Proto, p.DstPorts = 6, PortRange{443, 443}
		}
		ps = append(ps, p)
	}
	return ps
}

func benchFlows(n int) []packet.Flow {
	r := rand.New(rand.NewPCG(1, 1))
	fs := make([]packet.Flow, 1024)
	for i := range fs {
		h := r.IntN(n)
		fs[i] = packet.Flow{Src: netip.AddrFrom4([4]byte{198, 18, 0, byte(r.IntN(256))}),
			Dst: netip.AddrFrom4([4]byte{198, 19, byte(h >> 8), byte(h)}), Proto: 6, SrcPort: 40000, DstPort: 443}
	}
	return fs
}

func BenchmarkLookupPolicy(b *testing.B) {
	for _, n := range []int{10, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			db := NewDB(Options{})
			for _, p := range benchPolicies(n) {
				if _, err := db.AddPolicy(p); err != nil {
					b.Fatal(err)
				}
			}
			fs := benchFlows(n)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if _, ok := db.LookupPolicy(0, DirOut, fs[i%len(fs)]); !ok {
					b.Fatal("no policy")
				}
			}
		})
	}
	// The worst shape for tuple space search: random prefix lengths of
	// both families make hundreds of tuples.
	b.Run("10000-random", func(b *testing.B) {
		db := NewDB(Options{})
		r := rand.New(rand.NewPCG(2, 2))
		for db.spdb.policyCount() < 10000 {
			db.AddPolicy(randPolicy(r))
		}
		fs := make([]packet.Flow, 1024)
		for i := range fs {
			fs[i] = randFlow(r)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			db.LookupPolicy(0, DirOut, fs[i%len(fs)])
		}
		b.ReportMetric(float64(len(db.spdb.dirs[DirOut].tuples)), "tuples")
	})
}

func benchDB(b *testing.B, n int) *DB {
	db := NewDB(Options{})
	for i := range uint32(n) {
		c := testConfig(0x10000+i, DirIn, i)
		c.EncKey = testKey(c.Suite.EncKeyLen())
		mustAdd(b, db, c)
	}
	return db
}

// BenchmarkLookupInbound looks up SPIs among 10,000 inbound states, from
// one goroutine and from all, and compares the lock-free table with a map
// behind an RWMutex.
func BenchmarkLookupInbound(b *testing.B) {
	const n = 10000
	db := benchDB(b, n)
	ref := map[uint32]*SA{}
	var mu sync.RWMutex
	for _, s := range db.SAs() {
		ref[s.SPI()] = s
	}
	rwLookup := func(spi uint32) *SA {
		mu.RLock()
		s := ref[spi]
		mu.RUnlock()
		return s
	}
	b.Run("lockfree", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			if db.LookupInbound(0x10000+uint32(i%n)) == nil {
				b.Fatal("miss")
			}
		}
	})
	b.Run("lockfree-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if db.LookupInbound(0x10000+uint32(i%n)) == nil {
					b.Fatal("miss")
				}
				i++
			}
		})
	})
	b.Run("rwmutex-map", func(b *testing.B) {
		for i := range b.N {
			if rwLookup(0x10000+uint32(i%n)) == nil {
				b.Fatal("miss")
			}
		}
	})
	b.Run("rwmutex-map-parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if rwLookup(0x10000+uint32(i%n)) == nil {
					b.Fatal("miss")
				}
				i++
			}
		})
	})
}

// BenchmarkAddSA10000 installs 10,000 states (building their AES-GCM
// transforms) into an empty DB per iteration.
func BenchmarkAddSA10000(b *testing.B) {
	for range b.N {
		benchDB(b, 10000)
	}
}

// BenchmarkAddPolicy10000 installs 10,000 policies into an empty DB per
// iteration.
func BenchmarkAddPolicy10000(b *testing.B) {
	ps := benchPolicies(10000)
	b.ResetTimer()
	for range b.N {
		db := NewDB(Options{})
		for _, p := range ps {
			if _, err := db.AddPolicy(p); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// BenchmarkDataPathBatch is what the data path does per outbound batch of
// 64 packets on a state shared by all workers: hold, reserve, release,
// account.
func BenchmarkDataPathBatch(b *testing.B) {
	// A block that a tight loop cannot outrun before the background
	// extension is scheduled (see BenchmarkReserveSeq).
	db := NewDB(Options{SeqBlock: 1 << 40})
	s := mustAdd(b, db, testConfig(0x100, DirOut, 1))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if !s.Hold() {
				b.Fatal("Hold failed")
			}
			if _, g := s.ReserveSeq(64); g != 64 {
				b.Fatal("no sequence numbers")
			}
			s.Release()
			s.Account(64, 64*1400)
		}
	})
}

// BenchmarkReserveSeq is the data path's per-batch sequence number
// reservation (64 packets) on one state: from one goroutine, and from
// every worker at once. The reservation block is large enough that a
// tight loop never outruns the background extension (a real batch spends
// tens of microseconds in crypto between two reservations).
func BenchmarkReserveSeq(b *testing.B) {
	newState := func() *SA {
		s := mustAdd(b, NewDB(Options{SeqBlock: 1 << 40}), testConfig(0x100, DirOut, 1))
		s.seqMax = 1<<64 - 1 // never exhausted, however long it runs
		return s
	}
	b.Run("serial", func(b *testing.B) {
		s := newState()
		b.ReportAllocs()
		for range b.N {
			if _, g := s.ReserveSeq(64); g == 0 {
				b.Fatal("no sequence numbers")
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		s := newState()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				s.ReserveSeq(64)
			}
		})
	})
}
