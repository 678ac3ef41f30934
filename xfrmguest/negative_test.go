package xfrmguest_test

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
	"github.com/espd/espd/testbed"
)

// counters is a snapshot of one side's counters, by name.
type counters map[string]uint64

// diff returns the counters that changed from c to d, with the change.
func (c counters) diff(d counters) map[string]int64 {
	out := map[string]int64{}
	for k, v := range d {
		if c[k] != v {
			out[k] = int64(v) - int64(c[k])
		}
	}
	for k, v := range c {
		if _, ok := d[k]; !ok {
			out[k] = -int64(v)
		}
	}
	return out
}

func fmtDiff(d map[string]int64) string {
	var keys []string
	for k := range d {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, " %s%+d", k, d[k])
	}
	if b.Len() == 0 {
		return " nothing"
	}
	return b.String()
}

// espdCounters returns espd's global counters (global.*; global.drops.*
// sums the states' drops) and those of its state spi (sa.*).
func (l *lab) espdCounters(t *testing.T, spi uint32) counters {
	t.Helper()
	out := l.espctl(t, "--json", "stats")
	var v struct {
		Global map[string]any `json:"global"`
		SAs    []struct {
			SPI   uint32 `json:"spi"`
			Stats struct {
				Packets uint64            `json:"packets"`
				Drops   map[string]uint64 `json:"drops"`
			} `json:"stats"`
		} `json:"sas"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("espctl --json stats: %v\n%s", err, out)
	}
	c := counters{}
	for k, x := range v.Global {
		switch x := x.(type) {
		case float64:
			c["global."+k] = uint64(x)
		case map[string]any:
			for r, n := range x {
				if f, ok := n.(float64); ok {
					c["global."+k+"."+r] = uint64(f)
				}
			}
		}
	}
	found := false
	for _, s := range v.SAs {
		if s.SPI != spi {
			continue
		}
		found = true
		c["sa.packets"] = s.Stats.Packets
		for r, n := range s.Stats.Drops {
			c["sa.drops."+r] = n
		}
	}
	if !found {
		t.Fatalf("espctl stats has no state 0x%x:\n%s", spi, out)
	}
	return c
}

// bitmapRE finds the window's bitmap in "ip xfrm state" output of an ESN
// state (the words after "bitmap-length N").
var bitmapRE = regexp.MustCompile(`bitmap-length \d+\s+([0-9a-f \t\n]+)`)

var stateStatsRE = regexp.MustCompile(`replay-window (\d+) replay (\d+) failed (\d+)`)

// kernelCounters returns the guest's /proc/net/xfrm_stat and the counters
// of its state spi from src to dst ("ip -s xfrm state": state.packets from
// the lifetime line, and state.replay-window, state.replay and
// state.failed from its stats line).
func (l *lab) kernelCounters(t *testing.T, ctx context.Context, spi uint32, src, dst netip.Addr) counters {
	t.Helper()
	c := counters(l.xfrmStat(t, ctx))
	st := l.guestShowState(t, ctx, spi, src, dst)
	m := stateStatsRE.FindStringSubmatch(st)
	if m == nil || packets(st) < 0 {
		t.Fatalf("no stats in the guest's state:\n%s", st)
	}
	c["state.packets"] = uint64(packets(st))
	for i, k := range []string{"replay-window", "replay", "failed"} {
		c["state."+k], _ = strconv.ParseUint(m[i+1], 10, 64)
	}
	return c
}

// settle polls read until its counters differ from before (at most 10 s),
// then reads them once more after a pause, so that a late second change
// shows too, and returns the change.
func settle(before counters, read func() counters) map[string]int64 {
	after := before
	testbed.Poll(10*time.Second, 100*time.Millisecond, func() bool {
		after = read()
		return len(before.diff(after)) > 0
	})
	time.Sleep(500 * time.Millisecond)
	return before.diff(read())
}

// checkDiff fails the test unless got is exactly want.
func checkDiff(t *testing.T, what string, got, want map[string]int64) {
	t.Helper()
	ok := len(got) == len(want)
	for k, v := range want {
		if got[k] != v {
			ok = false
		}
	}
	if !ok {
		t.Errorf("%s moved%s, want%s", what, fmtDiff(got), fmtDiff(want))
	} else {
		t.Logf("%s moved%s", what, fmtDiff(got))
	}
}

// captured waits for the capture to hold a frame of ESP on spi sent by
// the namespace (outgoing) or received by it, and returns the last one's
// IP packet (a copy).
func (l *lab) captured(t *testing.T, spi uint32, outgoing bool) []byte {
	t.Helper()
	var pkt []byte
	testbed.Poll(5*time.Second, 50*time.Millisecond, func() bool {
		fr := l.cap.Frames()
		for i := len(fr) - 1; i >= 0; i-- {
			if f := &fr[i]; f.SPI == spi && f.Outgoing == outgoing && f.ESP() != nil {
				pkt = append([]byte(nil), f.IP()...)
				return true
			}
		}
		return false
	})
	if pkt == nil {
		t.Fatalf("the capture holds no ESP packet on SPI 0x%x", spi)
	}
	return pkt
}

// espOffset returns where the ESP header starts in an IP packet of the
// pair's outer family and encapsulation (no IPv6 extension headers: the
// kernel and espd put none).
func espOffset(p *pair, pkt []byte) int {
	off := 40
	if p.espdO.Is4() {
		off = int(pkt[0]&0x0f) * 4
	}
	if p.udp {
		off += 8
	}
	return off
}

// tampered returns two crafted packets of the negative cases made from
// the captured ESP packet pkt: pkt itself again (a replay) and pkt with an
// SPI no state has.
func tampered(p *pair, pkt []byte) (replay, spi []byte) {
	replay = append([]byte(nil), pkt...)
	spi = append([]byte(nil), pkt...)
	binary.BigEndian.PutUint32(spi[espOffset(p, spi):], 0x7eadbeef)
	if p.udp {
		fixUDP(p, spi)
	}
	return replay, spi
}

// flipICV returns pkt, an ESP packet the test built, with the last byte
// of its ICV flipped.
func flipICV(p *pair, pkt []byte) []byte {
	b := append([]byte(nil), pkt...)
	b[len(b)-1] ^= 0x01
	if p.udp {
		fixUDP(p, b)
	}
	return b
}

// fixUDP recomputes the UDP checksum of an ESP-in-UDP packet after a
// change to its payload.
func fixUDP(p *pair, pkt []byte) {
	off := espOffset(p, pkt) - 8
	var src, dst netip.Addr
	if p.espdO.Is4() {
		src, dst = netip.AddrFrom4([4]byte(pkt[12:16])), netip.AddrFrom4([4]byte(pkt[16:20]))
	} else {
		src, dst = netip.AddrFrom16([16]byte(pkt[8:24])), netip.AddrFrom16([16]byte(pkt[24:40]))
	}
	u, err := testbed.BuildUDP(src, dst, binary.BigEndian.Uint16(pkt[off:]), binary.BigEndian.Uint16(pkt[off+2:]), pkt[off+8:])
	if err != nil {
		panic(err)
	}
	copy(pkt[off:], u)
}

// freshSeq is the sequence number of the crafted packets of the
// negative cases: above the few the pings used, inside no window yet.
const freshSeq = 1000

// negativeCase is one crafted packet and the counters it must move (a
// change of +1 each, and no other change).
type negativeCase struct {
	name string
	pkt  []byte
	want []string
	// ignore are counters left out of the comparison: a valid packet's
	// inner packet is answered, which espd counts on its outbound state.
	ignore []string
}

// runNegative injects each case's packet from espd's namespace and checks
// what read's counters did.
func runNegative(t *testing.T, l *lab, what string, read func() counters, cases []negativeCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := read()
			if err := l.node.InjectIP(c.pkt); err != nil {
				t.Fatal(err)
			}
			got := settle(before, read)
			for _, k := range c.ignore {
				delete(got, k)
			}
			want := map[string]int64{}
			for _, k := range c.want {
				want[k] = 1
			}
			checkDiff(t, what, got, want)
		})
	}
}

// negativeEspd sends espd, from the guest's outer address, a replay of a
// packet the guest sent it, a packet built with the state's key and a
// fresh sequence number with its ICV flipped, the same packet unflipped
// (which must be taken: the flip alone made the difference), and the
// captured packet with an SPI no state has; each must move exactly its
// counter: the state's replay drops, its integrity drops, its packets, the
// global invalid-SPI count (global.drops.* sums the states' drops, so it
// moves with them). Sent to espd's own address, the packets reach espd's
// sockets through lo as if they came over the link.
func negativeEspd(t *testing.T, ctx context.Context, l *lab, udp, v6 bool) {
	p := l.newPair(t, "aes128gcm16", v6, v6, udp)
	l.install(t, ctx, p)
	l.pingFromGuest(t, ctx, p, 1, "")
	replay, spi := tampered(p, l.captured(t, p.in, false))
	fresh, err := craftESP(p, true, freshSeq)
	if err != nil {
		t.Fatal(err)
	}
	runNegative(t, l, "espd's counters", func() counters { return l.espdCounters(t, p.in) }, []negativeCase{
		{name: "replay", pkt: replay, want: []string{"sa.drops.replay", "global.drops.replay"}},
		{name: "flipped-icv", pkt: flipICV(p, fresh), want: []string{"sa.drops.integrity", "global.drops.integrity"}},
		{name: "same-packet-unflipped", pkt: fresh, want: []string{"sa.packets"},
			ignore: []string{"global.packets", "global.bytes"}},
		{name: "unknown-spi", pkt: spi, want: []string{"global.invalid_spi"}},
	})
}

// negativeKernel sends the guest, over the tap device, the same kinds of
// packet as negativeEspd sends espd, and checks that each moves exactly
// the kernel's counters for it: the state's stats line (replay, failed),
// its packets, and /proc/net/xfrm_stat.
func negativeKernel(t *testing.T, ctx context.Context, l *lab, udp, v6 bool) {
	p := l.newPair(t, "aes128gcm16", v6, v6, udp)
	l.install(t, ctx, p)
	l.pingFromEspd(t, ctx, p, 1)
	replay, spi := tampered(p, l.captured(t, p.out, true))
	fresh, err := craftESP(p, false, freshSeq)
	if err != nil {
		t.Fatal(err)
	}
	read := func() counters { return l.kernelCounters(t, ctx, p.out, p.espdO, p.guestO) }
	runNegative(t, l, "the kernel's counters", read, []negativeCase{
		{name: "replay", pkt: replay, want: []string{"state.replay", "XfrmInStateSeqError"}},
		{name: "flipped-icv", pkt: flipICV(p, fresh), want: []string{"state.failed", "XfrmInStateProtoError"}},
		{name: "same-packet-unflipped", pkt: fresh, want: []string{"state.packets"}},
		{name: "unknown-spi", pkt: spi, want: []string{"XfrmInNoStates"}},
	})
}

// kernelESNEmptyState records what the guest's kernel does with an
// inbound ESN state that has seen nothing when the first packet's
// sequence number lies just below 2^32 (high half 0): xfrm_replay_seqhi's
// case B infers a high half of 2^32-1, so the ICV (which covers the high
// half) fails and the packet is dropped as an integrity failure; the same
// low half sent with a high half of 2^32-1 is taken, which shows the
// inference, as an old number inside the window below 0: the replay state
// stays at 0 (seq-hi 0x0, seq 0x0) and only the window's bitmap records
// it. With the state's replay state set below the packet
// (replay-seq 0xffffffe0) the packets of high half 0 are taken and cross
// 2^32. The packets are built with espd's own esp and crypto packages, so
// that the sequence numbers are the test's to choose.
func kernelESNEmptyState(t *testing.T, ctx context.Context, l *lab) {
	for _, c := range []struct {
		name      string
		replaySeq uint64
		seqs      []uint64
		want      map[string]int64
		seqHi     string // the state's replay state afterwards
		bitmap    bool   // whether its window's bitmap records a packet
	}{
		{"empty", 0, []uint64{1<<32 - 2},
			map[string]int64{"state.failed": 1, "XfrmInStateProtoError": 1}, "seq-hi 0x0, seq 0x0,", false},
		{"empty-high-half-2^32-1", 0, []uint64{1<<64 - 2},
			map[string]int64{"state.packets": 1}, "seq-hi 0x0, seq 0x0,", true},
		{"replay-seq-0xffffffe0", 0xffffffe0, []uint64{1<<32 - 2, 1<<32 - 1, 1 << 32, 1<<32 + 1},
			map[string]int64{"state.packets": 4}, "seq-hi 0x1, seq 0x1,", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := l.newPair(t, "aes128gcm16-esn", false, false, false)
			p.guestReplaySeq = c.replaySeq
			l.install(t, ctx, p)
			read := func() counters { return l.kernelCounters(t, ctx, p.out, p.espdO, p.guestO) }
			before := read()
			for _, seq := range c.seqs {
				pkt, err := craftESP(p, false, seq)
				if err != nil {
					t.Fatal(err)
				}
				if err := l.node.InjectIP(pkt); err != nil {
					t.Fatal(err)
				}
			}
			got := settle(before, read)
			if len(c.seqs) > 1 {
				// Wait for the last of them.
				testbed.Poll(10*time.Second, 100*time.Millisecond, func() bool {
					got = before.diff(read())
					return got["state.packets"] >= int64(len(c.seqs))
				})
			}
			checkDiff(t, "the kernel's counters", got, c.want)
			st := l.guestShowState(t, ctx, p.out, p.espdO, p.guestO)
			m := bitmapRE.FindStringSubmatch(st)
			if !strings.Contains(st, c.seqHi) || m == nil || strings.Trim(m[1], "0 \t\n") != "" != c.bitmap {
				t.Errorf("the guest's state's replay state is not %q with a bitmap that records a packet: %v:\n%s", c.seqHi, c.bitmap, st)
			}
		})
	}
}

// craftESP returns an ESP packet on one of the pair's states, to espd
// (toEspd: the guest's outbound state, from the guest's outer address) or
// to the guest (espd's outbound state), ESP-in-UDP if the pair is, with
// sequence number seq (all 64 bits go into the ICV with ESN). It holds a
// UDP datagram to the discard port between the inner addresses.
func craftESP(p *pair, toEspd bool, seq uint64) ([]byte, error) {
	spi, k := p.out, p.kOut
	src, dst, isrc, idst := p.espdO, p.guestO, p.espdI, p.guestI
	if toEspd {
		spi, k = p.in, p.kIn
		src, dst, isrc, idst = p.guestO, p.espdO, p.guestI, p.espdI
	}
	udp, err := testbed.BuildUDP(isrc, idst, 40000, 9, []byte("espd interop test: crafted packet"))
	if err != nil {
		return nil, err
	}
	inner, err := testbed.BuildIP(isrc, idst, 17, udp)
	if err != nil {
		return nil, err
	}
	tr, err := crypto.New(p.suite, k.enc, k.integ)
	if err != nil {
		return nil, err
	}
	e := &esp.Encapsulator{SPI: spi, Transform: tr, Outer: esp.Outer{Src: src, Dst: dst}}
	const headroom = 128
	buf := make([]byte, headroom+len(inner), headroom+len(inner)+128)
	copy(buf[headroom:], inner)
	pk, err := e.Encapsulate(buf, headroom, len(inner), seq)
	if err != nil {
		return nil, err
	}
	payload, proto := buf[pk.ESP:pk.End], uint8(50)
	if p.udp {
		if payload, err = testbed.BuildUDP(src, dst, testbed.EncapPort, testbed.EncapPort, payload); err != nil {
			return nil, err
		}
		proto = 17
	}
	return testbed.BuildIP(src, dst, proto, payload)
}
