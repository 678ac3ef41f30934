package dataplane

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/esp"
	"github.com/espd/espd/packet"
	"github.com/espd/espd/sa"
)

// manyTunnels returns n (at most 256) tunnels, tunnel k protecting
// 198.19.k+1.0/24 (198.19.0.0/24 for the 256th) with SPI 0x1001+k, and a
// destination in each.
func manyTunnels(n int) ([]tunnel, []netip.Addr) {
	tns := make([]tunnel, n)
	dsts := make([]netip.Addr, n)
	for k := range tns {
		net := netip.AddrFrom4([4]byte{198, 19, byte(k + 1), 0})
		tns[k] = tunnel{reqid: uint32(k + 1), spi: 0x1000 + uint32(k+1), dst: netip.PrefixFrom(net, 24)}
		dsts[k] = netip.AddrFrom4([4]byte{198, 19, byte(k + 1), 9})
	}
	return tns, dsts
}

// outerSeq returns the SPI and the sequence number (low 32 bits) of the
// outer packet p as the fake Bind put it on the wire.
func outerSeq(p []byte) (spi, seq uint32) {
	var m conn.Message
	m.Buf = make([]byte, BufferSize)
	deliver(&m, p)
	e := m.Buf[m.Start:m.End]
	spi, _ = esp.SPI(e)
	if len(e) >= esp.HeaderLen {
		seq = binary.BigEndian.Uint32(e[4:8])
	}
	return spi, seq
}

// TestOrderPerStateManyStates sends the traffic of 64 tunnels, mixed
// irregularly within every batch, through a looped-back device with 4
// workers (and so 4 in-order shards per direction, each of which gets
// states), and checks that every state's sequence numbers leave in order
// and without gaps at the Bind, that every tunnel's inner packets come
// out of the TUN in order, and that no genuine packet is dropped as a
// replay (run it with -race).
func TestOrderPerStateManyStates(t *testing.T) {
	const nt, workers = 64, 4
	h := newHarness(t, Config{Workers: workers, QueueLen: 256}, true)
	tns, dsts := manyTunnels(nt)
	var ins []*sa.SA
	perShard := make([]int, shardCount(workers))
	for _, tn := range tns {
		_, in := h.add(tn)
		ins = append(ins, in)
		perShard[shardOf(tn.spi, shardCount(workers))]++
	}
	for k, n := range perShard {
		if n == 0 {
			t.Fatalf("shard %d has no state (%v): the test would not run the shards in parallel", k, perShard)
		}
	}
	const batches, per = 200, 64
	rng := rand.New(rand.NewPCG(14, 2))
	next := make([]uint64, nt)
	for range batches {
		pkts := make([][]byte, 0, per)
		for j := range per {
			k := rng.IntN(nt)
			pkts = append(pkts, udpPacket(innerSrc4, dsts[k], 1000, 2000, next[k], 80+j*16, false))
			next[k]++
		}
		h.tun.in <- pkts
	}
	const total = batches * per
	waitFor(t, "all packets back in the TUN", func() bool { return h.tun.count.Load() >= total })

	got := make([]uint64, nt)
	for _, p := range h.tun.packets() {
		f, err := packet.ParseFlow(p)
		if err != nil {
			t.Fatal(err)
		}
		k := int(f.Dst.As4()[2]) - 1
		if c := counterOf(p); c != got[k] {
			t.Fatalf("tunnel %d: inner packet %d came out of the TUN when %d was due", k+1, c, got[k])
		}
		got[k]++
	}
	seqs := make(map[uint32]uint32)
	for _, p := range h.tx.packets() {
		spi, seq := outerSeq(p)
		if seq != seqs[spi]+1 {
			t.Fatalf("SPI %#x: sequence number %d left after %d", spi, seq, seqs[spi])
		}
		seqs[spi] = seq
	}
	for k, tn := range tns {
		if got[k] != next[k] || uint64(seqs[tn.spi]) != next[k] {
			t.Errorf("tunnel %d: %d packets sent, %d left the Bind, %d back in the TUN", k+1, next[k], seqs[tn.spi], got[k])
		}
		st := ins[k].Stats()
		if st.Drops != ([sa.NumDropReasons]uint64{}) || st.Packets != next[k] {
			t.Errorf("tunnel %d: inbound state accounted %d packets (want %d), drops %v", k+1, st.Packets, next[k], st.Drops)
		}
	}
	waitStats(t, h.d, "every packet counted", func(st Stats) bool {
		return st.TUNRxPackets == total && st.TxPackets == total && st.RxPackets == total && st.TUNTxPackets == total
	})
	if st := h.d.Stats(); st.QueueDrops != 0 || totalDrops(h.db.Stats().Drops) != 0 {
		t.Errorf("stats %+v, states' drops %v", st, h.db.Stats().Drops)
	}
}

// startOn starts a device with cfg on tun and bind (whose receivers it
// reads) and returns it with its database.
func startOn(t *testing.T, cfg Config, tun TUN, bind conn.Bind) (*Device, *sa.DB) {
	t.Helper()
	db := sa.NewDB(sa.Options{Loopback: true})
	d, err := New(cfg, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	statsHook = d.Stats
	if err := d.Start(IO{TUN: tun, Bind: bind}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d, db
}

// twoShards returns two SPIs whose states are in different shards of a
// device with n shards.
func twoShards(t *testing.T, n int) (a, b uint32) {
	a = 0x100
	for b = a + 1; b < a+1000; b++ {
		if shardOf(b, n) != shardOf(a, n) {
			return a, b
		}
	}
	t.Fatalf("no SPI after %#x in another of %d shards", a, n)
	return
}

// gate blocks the goroutines that pass it until it is opened.
type gate struct {
	ch      chan struct{}
	once    sync.Once
	blocked atomic.Int32 // goroutines blocked now
}

func newGate(t *testing.T) *gate {
	g := &gate{ch: make(chan struct{})}
	t.Cleanup(g.open) // before the device closes: a failed test does not hang
	return g
}

func (g *gate) pass() {
	g.blocked.Add(1)
	<-g.ch
	g.blocked.Add(-1)
}

func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }

// gatedBind is a fake Bind whose Send blocks while it carries a packet to
// peer and its gate is shut: a socket stuck for one peer.
type gatedBind struct {
	*fakeSender
	peer netip.Addr
	gate *gate
}

func (g *gatedBind) Send(pkts []conn.Packet) (int, error) {
	for i := range pkts {
		if pkts[i].Dst == g.peer {
			g.gate.pass()
			break
		}
	}
	return g.fakeSender.Send(pkts)
}

// TestStatesDoNotWaitOutbound: with the sends to one peer stuck, the
// packets of a state whose in-order stage is another shard's still leave,
// though every batch read from the TUN holds packets of both; the stuck
// state's packets that do not fit its shard's queue are counted as queue
// drops; once the sends go again, what was queued leaves in order.
func TestStatesDoNotWaitOutbound(t *testing.T) {
	const workers = 2
	spiA, spiB := twoShards(t, shardCount(workers))
	peerA, peerB := peer4, netip.MustParseAddr("198.18.0.3")
	tunA := tunnel{reqid: 1, spi: spiA, dst: netip.MustParsePrefix("198.19.1.0/24"), local: local4, peer: peerA}
	tunB := tunnel{reqid: 2, spi: spiB, dst: netip.MustParsePrefix("198.19.2.0/24"), local: local4, peer: peerB}
	dstA, dstB := netip.MustParseAddr("198.19.1.1"), netip.MustParseAddr("198.19.2.1")

	tx := &fakeSender{record: true}
	tx.recv = []conn.Receiver{newFakeReceiver(newWire(8))}
	ft := newFakeTUN(64, 1400)
	bind := &gatedBind{fakeSender: tx, peer: peerA}
	d, db := startOn(t, Config{Workers: workers, QueueLen: 2}, ft, bind)
	bind.gate = newGate(t)
	h := &harness{t: t, d: d, db: db, tun: ft, tx: tx}
	outA, _ := h.add(tunA)
	outB, _ := h.add(tunB)

	const batches, per = 100, 8
	go func() {
		var n uint64
		for range batches {
			pkts := make([][]byte, 0, per)
			for j := range per {
				dst := dstA
				if j%2 == 1 {
					dst = dstB
				}
				pkts = append(pkts, udpPacket(innerSrc4, dst, 1, 2, n, 100, false))
				n++
			}
			select {
			case ft.in <- pkts:
			case <-ft.closed:
				return
			}
		}
	}()
	const half = batches * per / 2
	waitFor(t, "every packet of state B sent while A's sends are stuck", func() bool { return outB.Stats().Packets == half })
	if bind.gate.blocked.Load() == 0 {
		t.Fatal("no send to A's peer is blocked: the test did not stall state A")
	}
	if st := d.Stats(); st.QueueDrops == 0 {
		t.Errorf("no queue drops for state A with its sends stuck: %+v", st)
	}
	bind.gate.open()
	waitFor(t, "state A's queued packets to leave", func() bool {
		return outA.Stats().Packets+d.Stats().QueueDrops == half
	})
	seqs := make(map[uint32]uint32)
	for _, p := range tx.packets() {
		spi, seq := outerSeq(p)
		if seq <= seqs[spi] {
			t.Fatalf("SPI %#x: sequence number %d left after %d", spi, seq, seqs[spi])
		}
		if spi == spiB && seq != seqs[spi]+1 {
			t.Fatalf("state B: sequence number %d after %d: a gap without drops", seq, seqs[spi])
		}
		seqs[spi] = seq
	}
}

// gatedTUN is a fake TUN whose Write blocks while it carries a packet
// to dst and its gate is shut: a stage stuck on one tunnel's packets.
type gatedTUN struct {
	*fakeTUN
	dst  netip.Prefix
	gate *gate
}

func (g *gatedTUN) Write(bufs [][]byte, offset int) error {
	for _, b := range bufs {
		if f, err := packet.ParseFlow(b[offset:]); err == nil && g.dst.Contains(f.Dst) {
			g.gate.pass()
			break
		}
	}
	return g.fakeTUN.Write(bufs, offset)
}

// TestStatesDoNotWaitInbound: with the TUN writes of one inbound state's
// packets stuck, the packets of a state in another shard still reach the
// TUN, in order and without replay drops, though every batch received
// holds packets of both; once the writes go again, what was queued of
// the stuck state arrives in order.
func TestStatesDoNotWaitInbound(t *testing.T) {
	const workers = 2
	spiA, spiB := twoShards(t, shardCount(workers))
	tunA := tunnel{reqid: 1, spi: spiA, dst: netip.MustParsePrefix("198.19.1.0/24"), skipOut: true}
	tunB := tunnel{reqid: 2, spi: spiB, dst: netip.MustParsePrefix("198.19.2.0/24"), skipOut: true}
	dstA, dstB := netip.MustParseAddr("198.19.1.1"), netip.MustParseAddr("198.19.2.1")

	rx := newBatchReceiver()
	tx := &fakeSender{record: true, recv: []conn.Receiver{rx}}
	gt := &gatedTUN{fakeTUN: newFakeTUN(64, 1400), dst: tunA.dst}
	d, db := startOn(t, Config{Workers: workers, QueueLen: 2, Batch: 16}, gt, tx)
	gt.gate = newGate(t)
	h := &harness{t: t, d: d, db: db, tun: gt.fakeTUN, tx: tx}
	_, inA := h.add(tunA)
	_, inB := h.add(tunB)
	peerA, peerB := newPeerSender(t, tunA, "aes128gcm16"), newPeerSender(t, tunB, "aes128gcm16")

	const batches, per = 100, 16
	go func() {
		var seq uint64 = 1
		for i := range batches {
			pkts := make([][]byte, 0, per)
			for j := range per / 2 {
				n := uint64(i*per/2 + j)
				pkts = append(pkts,
					peerA.packet(udpPacket(innerSrc4, dstA, 1, 2, n, 100, false), seq, packet.ECNECT0),
					peerB.packet(udpPacket(innerSrc4, dstB, 1, 2, n, 100, false), seq, packet.ECNECT0))
				seq++
			}
			select {
			case rx.in <- pkts:
			case <-rx.closed:
				return
			}
		}
	}()
	const half = batches * per / 2
	waitFor(t, "every packet of state B in the TUN while A's writes are stuck", func() bool { return inB.Stats().Packets == half })
	if gt.gate.blocked.Load() == 0 {
		t.Fatal("no TUN write of A's packets is blocked: the test did not stall state A")
	}
	if st := d.Stats(); st.QueueDrops == 0 {
		t.Errorf("no queue drops for state A with its writes stuck: %+v", st)
	}
	gt.gate.open()
	waitFor(t, "state A's queued packets in the TUN", func() bool {
		return inA.Stats().Packets+d.Stats().QueueDrops == half
	})
	last := map[netip.Addr]int64{dstA: -1, dstB: -1}
	for _, p := range gt.packets() {
		f, err := packet.ParseFlow(p)
		if err != nil {
			t.Fatal(err)
		}
		c := int64(counterOf(p))
		if c <= last[f.Dst] || (f.Dst == dstB && c != last[f.Dst]+1) {
			t.Fatalf("to %v: inner packet %d after %d", f.Dst, c, last[f.Dst])
		}
		last[f.Dst] = c
	}
	for _, s := range []*sa.SA{inA, inB} {
		if st := s.Stats(); st.Drops != ([sa.NumDropReasons]uint64{}) {
			t.Errorf("state %#x dropped %v", s.SPI(), st.Drops)
		}
	}
}

// TestShardQueueLen: the shards share the direction's QueueLen, at least
// minShardQueue each, so more workers do not mean more queued memory.
func TestShardQueueLen(t *testing.T) {
	for _, c := range []struct{ queueLen, shards, want int }{
		{16, 1, 16}, {16, 2, 8}, {16, 3, 6}, {16, 16, 2}, {16, 64, 2}, {1, 1, 2}, {1024, 8, 128},
	} {
		if got := shardQueueLen(c.queueLen, c.shards); got != c.want {
			t.Errorf("shardQueueLen(%d, %d) = %d, want %d", c.queueLen, c.shards, got, c.want)
		}
	}
}
