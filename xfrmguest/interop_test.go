package xfrmguest_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// TestInterop runs, for each kernel (subtests linux6.1 and linux6.12), the
// interop matrix between espd (in the test's namespace, outer 198.18.0.1
// and 2001:db8::1) and the guest kernel's XFRM (outer 198.18.0.2 and
// 2001:db8::2) on one guest boot and one espd per kernel: every
// suite both implement, raw ESP and ESP-in-UDP, IPv4 and IPv6 outer and
// inner, transport mode between the two hosts, ESN with the guest's
// sender crossing 2^32 and espd's (started
// near 2^32 with espctl's --oseq), what the kernel does with an ESN state
// that has seen nothing, the negative cases on each receiving side, and,
// last, that the capture of the link shows no cleartext. Each case keys a pair of tunnel states (espd -> guest and
// guest -> espd) on both sides and pings both ways; what one side sent on
// a state the other side received on it.
func TestInterop(t *testing.T) { eachKernel(t, interop) }

func interop(t *testing.T, series string) {
	l := newLab(t, series)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	type tc struct {
		suite               string
		udp, outer6, inner6 bool
	}
	var cases []tc
	// Every suite both implement, raw ESP over IPv4 with IPv4 inside and
	// ESP-in-UDP over IPv6 with IPv6 inside.
	for _, s := range []string{"aes128gcm16", "aes256gcm16", "aes128gcm12", "aes256gcm12", "chacha20poly1305",
		"aes128-sha1", "aes128-sha256", "aes256-sha384", "aes256-sha512", "null-sha256",
		"aes128gcm16-esn", "chacha20poly1305-esn", "aes256-sha256-esn"} {
		cases = append(cases, tc{suite: s}, tc{suite: s, udp: true, outer6: true, inner6: true})
	}
	// The other encapsulations and pairs of families, AEAD and CBC
	// alternating.
	for i, c := range []tc{
		{udp: false, outer6: false, inner6: true}, {udp: false, outer6: true, inner6: false},
		{udp: false, outer6: true, inner6: true}, {udp: true, outer6: false, inner6: false},
		{udp: true, outer6: false, inner6: true}, {udp: true, outer6: true, inner6: false},
	} {
		c.suite = []string{"aes256gcm16", "aes256-sha512-esn"}[i%2]
		cases = append(cases, c)
	}
	for _, c := range cases {
		name := fmt.Sprintf("%s/%s/outer-%s/inner-%s", c.suite, encapName(c.udp), family(c.outer6), family(c.inner6))
		t.Run(name, func(t *testing.T) {
			p := l.newPair(t, c.suite, c.outer6, c.inner6, c.udp)
			before := l.xfrmStat(t, ctx)
			l.install(t, ctx, p)
			t.Run("espd-to-kernel", func(t *testing.T) {
				l.pingFromEspd(t, ctx, p, 2)
				l.checkCounts(t, ctx, p, 2)
			})
			t.Run("kernel-to-espd", func(t *testing.T) {
				l.pingFromGuest(t, ctx, p, 2, "")
				l.checkCounts(t, ctx, p, 4)
			})
			l.checkNoErrors(t, ctx, p, before)
		})
	}

	// Transport mode between the two hosts' own addresses: AEAD and CBC,
	// raw and in UDP, both families. Pings of 3,000 bytes each way cross
	// as fragmented ESP (espd fragments its own, the kernel its own) and
	// come back whole.
	for _, c := range []struct {
		suite   string
		udp, v6 bool
	}{
		{"aes128gcm16", false, false}, {"aes256-sha256", true, true},
		{"chacha20poly1305", true, false}, {"aes128-sha1", false, true},
		{"aes256gcm16-esn", false, false}, {"aes256-sha512", true, false},
	} {
		name := fmt.Sprintf("transport/%s/%s/%s", c.suite, encapName(c.udp), family(c.v6))
		t.Run(name, func(t *testing.T) {
			p := l.newTransportPair(t, c.suite, c.v6, c.udp)
			before := l.xfrmStat(t, ctx)
			l.install(t, ctx, p)
			t.Run("espd-to-kernel", func(t *testing.T) {
				l.pingFromEspd(t, ctx, p, 2)
				l.pingFromEspd(t, ctx, p, 1, "-s", "3000")
				l.checkCounts(t, ctx, p, 3)
			})
			t.Run("kernel-to-espd", func(t *testing.T) {
				l.pingFromGuest(t, ctx, p, 2, "")
				l.pingFromGuest(t, ctx, p, 1, "-s 3000")
				l.checkCounts(t, ctx, p, 6)
			})
			if out := l.espctl(t, "sa", "get", "--spi", fmt.Sprintf("0x%x", p.in), "--dst", p.espdO.String()); !strings.Contains(out, "transport") {
				t.Errorf("espd's state does not show transport mode:\n%s", out)
			}
			l.checkNoErrors(t, ctx, p, before)
		})
	}

	// The guest's outbound ESN state starts just below 2^32 (the peer
	// starts just below 2^32: espd's inbound state has seen nothing), or
	// further below, by more than espd's replay window (128): its packets
	// cross 2^32 and all arrive. espd's highest sequence number seen is
	// then the guest's last.
	for _, c := range []struct {
		suite          string
		udp, v6        bool
		oseq           uint64
		pings          int
		pingOpts, name string
	}{
		{"aes128gcm16-esn", false, false, 1<<32 - 3, 4, "", "just-below"},
		{"aes256-sha256-esn", true, true, 1<<32 - 3, 4, "", "just-below"},
		{"chacha20poly1305-esn", false, false, 1<<32 - 200, 203, "-q", "further-below"},
	} {
		name := fmt.Sprintf("esn-crossing/kernel-to-espd/%s/%s/%s/%s", c.name, c.suite, encapName(c.udp), family(c.v6))
		t.Run(name, func(t *testing.T) {
			p := l.newPair(t, c.suite, c.v6, c.v6, c.udp)
			p.guestOseq = c.oseq
			before := l.xfrmStat(t, ctx)
			l.install(t, ctx, p)
			l.pingFromGuest(t, ctx, p, c.pings, c.pingOpts)
			in := l.espdSA(t, p.in, p.espdO)
			if want := c.oseq + uint64(c.pings); in.Stats.ReplayTop != want || in.Stats.Packets != uint64(c.pings) {
				t.Errorf("espd's inbound state: highest sequence number 0x%x after %d packets, want 0x%x after %d",
					in.Stats.ReplayTop, in.Stats.Packets, want, c.pings)
			}
			if in.Stats.ReplayTop <= 1<<32 {
				t.Errorf("espd's inbound state's highest sequence number 0x%x did not cross 2^32", in.Stats.ReplayTop)
			}
			l.checkNoErrors(t, ctx, p, before)
		})
	}

	// espd's outbound ESN state starts just below 2^32, the guest's
	// inbound one has its replay state set below that.
	t.Run("esn-crossing/espd-to-kernel/just-below/aes128gcm16-esn/raw/IPv4", func(t *testing.T) {
		oseq := espdOseqFlags(1<<32 - 3)
		p := l.newPair(t, "aes128gcm16-esn", false, false, false)
		p.espdOutExtra = oseq
		p.guestReplaySeq = 0xffffffe0
		before := l.xfrmStat(t, ctx)
		l.install(t, ctx, p)
		l.pingFromEspd(t, ctx, p, 4)
		out := l.espdSA(t, p.out, p.guestO)
		if out.Stats.SeqOut != 1<<32+1 {
			t.Errorf("espd's outbound state's last sequence number is 0x%x, want 0x%x", out.Stats.SeqOut, uint64(1<<32+1))
		}
		st := l.guestShowState(t, ctx, p.out, p.espdO, p.guestO)
		if n := packets(st); n != 4 || !strings.Contains(st, "seq-hi 0x1, seq 0x1,") {
			t.Errorf("the guest's inbound state counted %d packets (want 4) or did not cross 2^32:\n%s", n, st)
		}
		l.checkNoErrors(t, ctx, p, before)
	})

	t.Run("kernel-esn-empty-state", func(t *testing.T) { kernelESNEmptyState(t, ctx, l) })

	for _, c := range []struct{ udp, v6 bool }{{false, false}, {true, true}} {
		sub := fmt.Sprintf("%s/%s", encapName(c.udp), family(c.v6))
		t.Run("negative/espd-receives/"+sub, func(t *testing.T) { negativeEspd(t, ctx, l, c.udp, c.v6) })
		t.Run("negative/kernel-receives/"+sub, func(t *testing.T) { negativeKernel(t, ctx, l, c.udp, c.v6) })
	}

	t.Run("no-cleartext-on-the-link", func(t *testing.T) { l.checkCapture(t) })
}

func encapName(udp bool) string {
	if udp {
		return "udp"
	}
	return "raw"
}

// espdOseqFlags returns the espctl sa add flags that make espd's outbound
// state send its first packet with sequence number oseq+1 (XFRM's oseq:
// the last number sent).
func espdOseqFlags(oseq uint64) []string {
	return []string{"--oseq", fmt.Sprintf("0x%x", oseq)}
}

// checkCounts checks that each state's packets were counted by both ends
// alike and that each direction carried at least n.
func (l *lab) checkCounts(t *testing.T, ctx context.Context, p *pair, n int) {
	t.Helper()
	eOut, eIn := l.espdSA(t, p.out, p.guestO), l.espdSA(t, p.in, p.espdO)
	gIn := packets(l.guestShowState(t, ctx, p.out, p.espdO, p.guestO))
	gOut := packets(l.guestShowState(t, ctx, p.in, p.guestO, p.espdO))
	if uint64(gIn) != eOut.Stats.Packets || gIn < n {
		t.Errorf("espd -> guest: espd sent %d packets, the guest received %d (want at least %d)", eOut.Stats.Packets, gIn, n)
	}
	if uint64(gOut) != eIn.Stats.Packets || gOut < n {
		t.Errorf("guest -> espd: the guest sent %d packets, espd received %d (want at least %d)", gOut, eIn.Stats.Packets, n)
	}
}

// checkNoErrors checks that the guest's XFRM error counters did not move
// since before and that espd dropped nothing on the pair's states.
func (l *lab) checkNoErrors(t *testing.T, ctx context.Context, p *pair, before map[string]uint64) {
	t.Helper()
	after := l.xfrmStat(t, ctx)
	for k, v := range after {
		if v != before[k] {
			t.Errorf("the guest's %s went from %d to %d", k, before[k], v)
		}
	}
	for _, s := range []saJSON{l.espdSA(t, p.out, p.guestO), l.espdSA(t, p.in, p.espdO)} {
		for r, v := range s.Stats.Drops {
			if v != 0 {
				t.Errorf("espd's state 0x%x dropped %d packets for %s", s.SPI, v, r)
			}
		}
	}
}

// checkCapture stops the capture and checks it: every frame between the
// outer addresses is ESP, ESP-in-UDP or a NAT keepalive (UDP 4500) or link
// housekeeping (ARP, neighbour discovery); no frame but those of NULL
// encryption states shows a ping's marker or an inner address; and those
// of the NULL states do show the marker, which proves the search sees
// cleartext where there is some.
func (l *lab) checkCapture(t *testing.T) {
	res, err := l.cap.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("capture on tap0: %s", res.Summary())
	if !res.Complete() {
		t.Errorf("the capture is incomplete: %s", res.Summary())
	}
	outer := map[netip.Addr]bool{espdOuter4: true, guestOuter4: true, espdOuter6: true, guestOuter6: true}
	marker, err := hex.DecodeString(espdMarkerHex)
	if err != nil {
		t.Fatal(err)
	}
	var cipher, null, nullMarked int
	var clear testbed.CaptureResult
	for i := range res.Frames {
		f := &res.Frames[i]
		isNull := (f.Class == testbed.ClassESP || f.Class == testbed.ClassESPInUDP) && l.nullSPIs[f.SPI]
		switch f.Class {
		case testbed.ClassESP, testbed.ClassESPInUDP:
			if isNull {
				null++
			} else {
				cipher++
			}
		case testbed.ClassKeepalive, testbed.ClassLink:
		default:
			if outer[f.Src] && outer[f.Dst] {
				t.Errorf("a frame between the outer addresses is not ESP: %s", f)
			}
		}
		hasMarker := bytes.Contains(f.Data, marker) || bytes.Contains(f.Data, guestMarker)
		switch {
		case isNull && hasMarker:
			nullMarked++
		case isNull:
		case hasMarker:
			t.Errorf("a frame shows a ping's marker in clear: %s", f)
		default:
			clear.Frames = append(clear.Frames, *f)
		}
	}
	for _, f := range clear.Leaks(espdInner4, guestInner4, espdInner6, guestInner6) {
		t.Errorf("a frame shows an inner address in clear: %s", &f)
	}
	if cipher == 0 || null == 0 || nullMarked == 0 {
		t.Errorf("the capture holds %d encrypted ESP frames, %d of NULL encryption of which %d show a marker: want some of each", cipher, null, nullMarked)
	}
}
