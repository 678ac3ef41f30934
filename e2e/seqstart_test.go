package e2e

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/espd/espd/esp"
	"github.com/espd/espd/testbed"
)

// Where sequence numbers start: espctl's --oseq on an outbound state and
// --replay-seq/--replay-bitmap on an inbound one, through two real espd
// gateways. The capture of gwA's transit link says what was sent; gwB's
// counters say what it accepted and refused.

// seqStartPort is the UDP port the client sends to through the tunnel.
const seqStartPort = 5001

// seqStartTunnel keys an IPv4 tunnel, raw ESP, aes128gcm16-esn, window 64,
// with aOut and bIn changed by the caller (oseq, replay state).
func seqStartTunnel(t *testing.T, aOut, bIn func(*saSpec)) (*testbed.Topology, *espd, *espd) {
	t.Helper()
	top := newTopology(t, 0)
	a, b := startEspd(t, top.GwA), startEspd(t, top.GwB)
	aOuter, bOuter := testbed.GwATransitV4.Addr(), testbed.GwBTransitV4.Addr()
	ab, ba := randKey(t, 20), randKey(t, 20)
	spec := func(spi uint32, dir string, src, dst netip.Addr, key []byte) saSpec {
		return saSpec{spi: spi, dir: dir, src: src, dst: dst, suite: "aes128gcm16-esn", encKey: key, reqid: 1, replayWindow: 64}
	}
	ao, bi := spec(spiAB, "out", aOuter, bOuter, ab), spec(spiAB, "in", aOuter, bOuter, ab)
	aOut(&ao)
	bIn(&bi)
	lanA, lanB := testbed.LANAV4, testbed.LANBV4
	keyAllSeq(t, a, []saSpec{ao, spec(spiBA, "in", bOuter, aOuter, ba)}, []policySpec{
		{src: lanA, dst: lanB, dir: "out", action: "protect", reqid: 1},
		{src: lanB, dst: lanA, dir: "in", action: "protect", reqid: 1}})
	keyAllSeq(t, b, []saSpec{spec(spiBA, "out", bOuter, aOuter, ba), bi}, []policySpec{
		{src: lanB, dst: lanA, dir: "out", action: "protect", reqid: 1},
		{src: lanA, dst: lanB, dir: "in", action: "protect", reqid: 1}})
	return top, a, b
}

// sendThrough sends n datagrams from the client to the server through
// the tunnel, one every 20 ms, and returns the low sequence numbers of
// the ESP packets gwA sent with spiAB, in the order of the link.
func sendThrough(t *testing.T, top *testbed.Topology, n int) []uint32 {
	t.Helper()
	capt, err := top.GwA.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 96})
	if err != nil {
		t.Fatal(err)
	}
	defer capt.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dst := netip.AddrPortFrom(serverAddr(testbed.IPv4), seqStartPort)
	// A listener, so that the server answers no datagram with a port
	// unreachable (which would fail the client's next send).
	recv, err := top.Server.ListenUDP(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer recv.Close()
	if _, err := top.Client.SendUDP(ctx, dst, testbed.UDPSendOptions{Count: n, Interval: 20 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	var seqs []uint32
	eventually(5*time.Second, func() bool {
		seqs = seqs[:0]
		for _, f := range capt.Frames() {
			if f.Outgoing && f.Class == testbed.ClassESP && f.SPI == spiAB {
				seqs = append(seqs, f.Seq)
			}
		}
		return len(seqs) >= n
	})
	return seqs
}

// TestSeqStartCrossing starts gwA's outbound ESN state at oseq 2^32-3:
// its first packet carries 2^32-2, the numbers cross 2^32, gwB (whose
// window has seen nothing: espd infers high half 0 for a first packet
// just below 2^32, where the kernel would infer 2^32-1) accepts every one,
// and both ends read the 64-bit numbers back.
func TestSeqStartCrossing(t *testing.T) {
	const oseq = 1<<32 - 3
	top, a, b := seqStartTunnel(t, func(s *saSpec) { s.oseq = oseq }, func(*saSpec) {})
	if got := a.saCounter(t, spiAB, testbed.GwBTransitV4.Addr(), "stats", "seq_out"); got != oseq {
		t.Fatalf("seq_out before any packet %d, want %d", got, uint64(oseq))
	}
	seqs := sendThrough(t, top, 8)
	if len(seqs) < 4 {
		t.Fatalf("gwA sent %d ESP packets: %v", len(seqs), seqs)
	}
	for i, s := range seqs {
		if want := uint32(oseq + 1 + uint64(i)); s != want {
			t.Fatalf("ESP packet %d carries low sequence number %#x, want %#x (all: %x)", i, s, want, seqs)
		}
	}
	n := uint64(len(seqs))
	bOuter := testbed.GwBTransitV4.Addr()
	if got := a.saCounter(t, spiAB, bOuter, "stats", "seq_out"); got != oseq+n {
		t.Errorf("gwA seq_out %#x, want %#x", got, uint64(oseq)+n)
	}
	if !eventually(5*time.Second, func() bool { return b.saCounter(t, spiAB, bOuter, cntPackets...) == n }) {
		t.Errorf("gwB accepted %d packets, want %d", b.saCounter(t, spiAB, bOuter, cntPackets...), n)
	}
	if got := b.saCounter(t, spiAB, bOuter, "stats", "replay_top"); got != oseq+n {
		t.Errorf("gwB replay_top %#x, want %#x", got, uint64(oseq)+n)
	}
	if r, i := b.saCounter(t, spiAB, bOuter, cntReplay...), b.saCounter(t, spiAB, bOuter, cntIntegrity...); r != 0 || i != 0 {
		t.Errorf("gwB dropped %d as replays and %d as ICV failures", r, i)
	}
}

// TestSeqStartReplayState gives gwB's inbound state a replay state that
// marks some of the numbers gwA is about to send as received: gwB refuses
// exactly those (counted as replays, before any decryption) and accepts
// the others, and reads the state back.
func TestSeqStartReplayState(t *testing.T) {
	const oseq, top = 1000, 1010
	// Bit i for 1010-i: 1005 (bit 5) and 1003 (bit 7) not received;
	// 1002 and below, which the one byte does not cover, count as
	// received.
	bitmap := []byte{0b0101_1111}
	tp, _, b := seqStartTunnel(t, func(s *saSpec) { s.oseq = oseq },
		func(s *saSpec) { s.replaySeq, s.replayBitmap = top, bitmap })
	bOuter := testbed.GwBTransitV4.Addr()
	if got := b.saCounter(t, spiAB, bOuter, "stats", "replay_top"); got != top {
		t.Fatalf("gwB replay_top %d before any packet, want %d", got, top)
	}
	seqs := sendThrough(t, tp, 15)
	var accept, refuse uint64
	for _, s := range seqs {
		if esp.ReplayStateSeen(top, bitmap, uint64(s)) {
			refuse++
		} else {
			accept++
		}
	}
	if len(seqs) == 0 || seqs[0] != oseq+1 || accept == 0 || refuse == 0 {
		t.Fatalf("gwA sent %v", seqs)
	}
	if !eventually(5*time.Second, func() bool {
		return b.saCounter(t, spiAB, bOuter, cntPackets...) == accept && b.saCounter(t, spiAB, bOuter, cntReplay...) == refuse
	}) {
		t.Errorf("gwB accepted %d and refused %d as replays; want %d and %d (gwA sent %v)",
			b.saCounter(t, spiAB, bOuter, cntPackets...), b.saCounter(t, spiAB, bOuter, cntReplay...), accept, refuse, seqs)
	}
	if got := b.saCounter(t, spiAB, bOuter, cntIntegrity...); got != 0 {
		t.Errorf("gwB counted %d ICV failures", got)
	}
}
