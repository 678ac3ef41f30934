package dataplane

import (
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"os"
	"sync"
	"testing"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
	"github.com/espd/espd/packet"
	"github.com/espd/espd/sa"
)

// batchReceiver is a Receiver that returns the outer packets pushed into
// in one batch per Receive, as recvmmsg returns what queued up.
type batchReceiver struct {
	in        chan [][]byte
	closed    chan struct{}
	closeOnce sync.Once
}

func newBatchReceiver() *batchReceiver {
	return &batchReceiver{in: make(chan [][]byte, 4), closed: make(chan struct{})}
}

func (r *batchReceiver) Receive(msgs []conn.Message) (int, error) {
	select {
	case pkts := <-r.in:
		n := min(len(pkts), len(msgs))
		for i := range n {
			deliver(&msgs[i], pkts[i])
		}
		return n, nil
	case <-r.closed:
		return 0, os.ErrClosed
	}
}

func (r *batchReceiver) Close() error {
	r.closeOnce.Do(func() { close(r.closed) })
	return nil
}

// peerSender builds the ESP packets the peer of a harness tunnel sends.
type peerSender struct {
	t   testing.TB
	enc esp.Encapsulator
}

func newPeerSender(t testing.TB, tn tunnel, suiteName string) *peerSender {
	suite, err := crypto.ParseSuite(suiteName)
	if err != nil {
		t.Fatal(err)
	}
	ek, ik := tunnelKeys(suite, tn.spi)
	tr, err := crypto.New(suite, ek, ik)
	if err != nil {
		t.Fatal(err)
	}
	return &peerSender{t: t, enc: esp.Encapsulator{SPI: tn.spi, Transform: tr, Outer: esp.Outer{Src: peer4, Dst: local4}}}
}

// dummy seals, with the peer's transform, a dummy ESP packet (Next Header
// 59, RFC 4303 section 2.6) of n zero bytes at buf[esp.MaxHeadroom:],
// padded 1, 2, 3, ... to the transform's block size, and frames it as
// Encapsulate frames its packets: Not-ECT, DF set (the DFCopy default).
// It is built here, not by the esp package, so that the receiving side is
// checked against a dummy of independent making.
func (p *peerSender) dummy(buf []byte, n int, seq uint64) esp.Packet {
	tr := p.enc.Transform
	bs, icv := tr.BlockSize(), tr.ICVSize()
	pad := (bs - (n+2)%bs) % bs
	off := esp.MaxHeadroom
	start := off - tr.IVSize() - esp.HeaderLen
	end := off + n + pad + 2 + icv
	pl := buf[off : end-icv]
	clear(pl[:n])
	for i := range pad {
		pl[n+i] = byte(i + 1)
	}
	pl[n+pad], pl[n+pad+1] = byte(pad), esp.NextHeaderDummy
	binary.BigEndian.PutUint32(buf[start:], p.enc.SPI)
	binary.BigEndian.PutUint32(buf[start+4:], uint32(seq))
	tr.Seal(buf[start:end], seq)
	return esp.Packet{ESP: start, End: end, DF: true}
}

// packet returns the outer packet carrying inner (a dummy if inner is nil)
// with sequence number seq and the outer ECN field ecn.
func (p *peerSender) packet(inner []byte, seq uint64, ecn uint8) []byte {
	buf := make([]byte, esp.MaxHeadroom+len(inner)+esp.MaxTrailer+64)
	copy(buf[esp.MaxHeadroom:], inner)
	var pk esp.Packet
	var err error
	if inner == nil {
		pk = p.dummy(buf, 40, seq)
	} else {
		pk, err = p.enc.Encapsulate(buf, esp.MaxHeadroom, len(inner), seq)
	}
	if err != nil {
		p.t.Fatal(err)
	}
	out := onWire(p.t, &p.enc, buf, pk, seq)
	packet.SetECN(out, ecn)
	return out
}

// TestReplayInOrderUnderManyWorkers sends an in-order ESP stream in
// batches of 128 to a device with 8 workers and a replay window of 32, so
// that workers are many windows apart, with dummy packets, packets that
// RFC 6040 drops (CE outside, Not-ECT inside) and duplicates among them.
// Nothing of the stream is lost or reordered, every duplicate is dropped
// and counted as a replay, and the window ends at the last number. Without
// ESN the duplicates go anywhere after their original (a copy far behind
// fails the window check, a near one the in-order record); with ESN, from
// just below 2^32 across it, they stay within the window of their
// original, since a copy older than the window infers into the next cycle
// and fails the ICV instead (RFC 4303 Appendix A).
func TestReplayInOrderUnderManyWorkers(t *testing.T) {
	for _, tc := range []struct {
		name   string
		suite  string
		first  uint64
		maxGap int // how far after its original a duplicate may go; 0: anywhere
	}{
		{"32-bit", "aes128gcm16", 1, 0},
		{"ESN across 2^32", "aes128gcm16-esn", 1<<32 - 2500, 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			testReplayInOrder(t, tc.suite, tc.first, tc.maxGap)
		})
	}
}

func testReplayInOrder(t *testing.T, suite string, first uint64, maxGap int) {
	const (
		batch   = 128
		n       = 40 * batch // unique packets
		dups    = 300
		window  = 32
		dummyAt = 97 // every dummyAt-th packet is a dummy
		ceAt    = 89 // every ceAt-th one has CE outside, Not-ECT inside
	)
	rx := newBatchReceiver()
	h := newHarnessWith(t, Config{Workers: 8, Batch: batch, QueueLen: 64}, false, rx)
	tn := tunnel{reqid: 5, spi: 0x500, dst: netip.MustParsePrefix("198.19.5.0/24"), suite: suite, window: window, skipOut: true}
	_, in := h.add(tn)
	peer := newPeerSender(t, tn, suite)
	dst := netip.MustParseAddr("198.19.5.5")

	// The stream, then the duplicates inserted after their originals.
	stream := make([][]byte, 0, n+dups)
	real := 0
	for i := range n {
		seq := first + uint64(i)
		switch {
		case i%dummyAt == dummyAt-1:
			stream = append(stream, peer.packet(nil, seq, 0))
		case i%ceAt == ceAt-1:
			stream = append(stream, peer.packet(udpPacket(innerSrc4, dst, 1, 2, 1<<40, 100, false), seq, packet.ECNCE))
		default:
			stream = append(stream, peer.packet(udpPacket(innerSrc4, dst, 1, 2, uint64(real), 100+i%200, false), seq, packet.ECNECT0))
			real++
		}
	}
	rng := rand.New(rand.NewPCG(uint64(first), 3))
	for range dups {
		k := rng.IntN(len(stream))
		gap := len(stream) - k
		if maxGap > 0 {
			gap = min(gap, maxGap)
		}
		at := k + 1 + rng.IntN(gap) // right after the original at the closest
		stream = append(stream[:at], append([][]byte{stream[k]}, stream[at:]...)...)
	}

	// Send it in batches, never more than 16 batches unfinished, so that
	// no queue overflows.
	done := func() int {
		return int(h.d.Stats().TUNTxPackets + totalDrops(in.Stats().Drops))
	}
	for sent := 0; sent < len(stream); {
		if sent-done() > 16*batch {
			waitFor(t, "the pipeline to catch up", func() bool { return sent-done() <= 8*batch })
		}
		end := min(sent+batch, len(stream))
		rx.in <- stream[sent:end]
		sent = end
	}
	waitFor(t, "the whole stream", func() bool { return done() == len(stream) })

	got := h.tun.packets()
	if len(got) != real {
		t.Errorf("%d packets reached the TUN, want %d", len(got), real)
	}
	for i, p := range got {
		if c := counterOf(p); c != uint64(i) {
			t.Fatalf("packet %d of the TUN is number %d", i, c)
		}
	}
	st := in.Stats()
	wantDrops := [sa.NumDropReasons]uint64{
		sa.DropReplay: dups, sa.DropDummy: n / dummyAt, sa.DropECN: uint64(n - real - n/dummyAt),
	}
	if st.Drops != wantDrops {
		t.Errorf("drops %v, want %v (replay, integrity, ..., dummy, ecn, ...)", st.Drops, wantDrops)
	}
	if st.Packets != uint64(real) {
		t.Errorf("state accounted %d packets, want %d", st.Packets, real)
	}
	if ds := waitStats(t, h.d, "every datagram counted", func(st Stats) bool {
		return st.RxPackets >= uint64(len(stream))
	}); ds.QueueDrops != 0 || ds.RxPackets != uint64(len(stream)) {
		t.Errorf("device stats %+v", ds)
	}
	if top := in.ReplayTop(); top != first+n-1 {
		t.Errorf("window top %#x, want %#x", top, first+n-1)
	}
}
