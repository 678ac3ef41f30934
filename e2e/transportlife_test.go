package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/espd/espd/sa"
	"github.com/espd/espd/testbed"
)

// TestTransportSeqRestart: gwA's espd, carrying transport mode to gwB, is
// killed with SIGKILL between two streams of datagrams, restarted with the
// same state directory and keyed again with the same SPIs and keys: every
// datagram of the second stream arrives, and no (SPI, sequence number)
// pair crosses the link twice; the restarted espd continues above
// everything its predecessor sent, skipping at most what it had reserved
// ahead (as TestSeqRestartKill requires of tunnel mode).
func TestTransportSeqRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h := newHostToHost(t, outerCase{testbed.IPv4, false, "aes128gcm16"})
	capt := startSeqCapture(t, h.top)
	stream := func(count int) {
		t.Helper()
		r, err := h.top.GwB.ListenUDP(netip.AddrPortFrom(h.bAddr, 0))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if _, err := h.top.GwA.SendUDP(ctx, r.Addr(), testbed.UDPSendOptions{Size: 200, Count: count, Interval: time.Millisecond}); err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
		defer wcancel()
		if err := r.WaitPackets(wctx, uint64(count)); err != nil {
			t.Fatalf("%d of %d datagrams arrived: %v", r.Packets(), count, err)
		}
	}
	stream(500)
	var before int
	if !eventually(10*time.Second, func() bool {
		before = outAfterLastMark(capt.Frames(), spiAB)
		return before >= 500
	}) {
		t.Fatalf("the capture has %d ESP packets of gwA's, want 500", before)
	}
	h.a.kill(t)
	a := startEspd(t, h.top.GwA)
	keyAllSeq(t, a, h.aSAs, h.aPolicies)
	stream(500)
	if !eventually(10*time.Second, func() bool { return outAfterLastMark(capt.Frames(), spiAB) >= before+500 }) {
		t.Fatalf("the capture has %d ESP packets of gwA's, want %d", outAfterLastMark(capt.Frames(), spiAB), before+500)
	}
	frames, err := capt.Stop()
	if err != nil {
		t.Fatal(err)
	}
	runs, dups := seqRuns(frames.Frames, spiAB)
	if len(dups) > 0 {
		t.Fatalf("%d (SPI, sequence number) pairs crossed the link twice, e.g. %v", len(dups), dups[:min(len(dups), 5)])
	}
	seqs := runs[0]
	last, first := seqs[before-1], seqs[before]
	for _, s := range seqs[:before] {
		last = max(last, s)
	}
	if first <= last || uint64(first-last-1) > 2*sa.DefaultSeqBlock {
		t.Errorf("killed after sequence number %d; the restarted espd began at %d, want above it by at most two blocks of %d",
			last, first, sa.DefaultSeqBlock)
	}
	t.Logf("killed after sequence number %d; the restarted espd sent from %d", last, first)
	a.alive(t)
}

// TestTransportKeyMem: after traffic both ways in transport mode, gwA's
// two states are deleted with espctl, and their keys, HMAC pads and hex
// forms are nowhere in espd's memory (as TestKeyMem requires of tunnel
// mode).
func TestTransportKeyMem(t *testing.T) {
	requireSecretErasure(t)
	for _, suite := range []string{"aes128gcm16", "aes128-sha256"} {
		t.Run(suite, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			h := newHostToHost(t, outerCase{testbed.IPv6, suite == "aes128-sha256", suite})
			for _, p := range []struct {
				from *testbed.Node
				dst  netip.Addr
			}{{h.top.GwA, h.bAddr}, {h.top.GwB, h.aAddr}} {
				if r, err := p.from.Ping(ctx, p.dst, testbed.PingOptions{Count: 2}); err != nil || !r.OK() {
					t.Fatalf("ping %v from %s: %v\n%s", p.dst, p.from.Role, err, r.Output)
				}
			}
			needles := map[string][]byte{}
			for _, s := range h.aSAs {
				for k, v := range keyNeedles(fmt.Sprintf("%s 0x%x", s.dir, s.spi), suite, s.encKey, s.integKey) {
					needles[k] = v
				}
			}
			expectInMemory(t, h.a, rawNeedles(needles))
			for _, s := range h.aSAs {
				h.a.mustCtl(t, saGetArgs("del", s.spi, s.dst)...)
			}
			expectErased(t, h.a, needles, "sa del")
			h.a.alive(t)
		})
	}
}
