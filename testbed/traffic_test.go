package testbed

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRoutedLine runs transfers over a plain routed line in both families
// and directions, captures one on the transit link and checks that the
// capture sees the cleartext (the leak detector works).
func TestRoutedLine(t *testing.T) {
	skipUnlessAvailable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	top := NewT(t, Options{Prefix: "etbtest", RouteLANs: true})

	for _, dst := range []netip.Addr{ServerV4.Addr(), ServerV6.Addr()} {
		r, err := top.Client.Ping(ctx, dst, PingOptions{Count: 2})
		if err != nil || !r.OK() {
			t.Fatalf("ping %v: %+v %v", dst, r, err)
		}
	}

	capt, err := top.GwB.StartCapture(IfTransit, CaptureOptions{Snaplen: 256})
	if err != nil {
		t.Fatal(err)
	}
	const size = 4 << 20
	cases := []struct {
		name     string
		from, to *Node
		dst      netip.Addr
		mss      int
	}{
		{"v4-up", top.Client, top.Server, ServerV4.Addr(), 0},
		{"v4-down", top.Server, top.Client, ClientV4.Addr(), 536},
		{"v6-up", top.Client, top.Server, ServerV6.Addr(), 0},
		{"v6-down", top.Server, top.Client, ClientV6.Addr(), 0},
	}
	for i, c := range cases {
		r, err := Transfer(ctx, TransferOptions{From: c.from, To: c.to, Dst: c.dst, Bytes: size, MSS: c.mss, Seed: uint64(i)})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if r.Bytes != size || r.Sent != r.Received || r.Duration <= 0 {
			t.Fatalf("%s: %v", c.name, r)
		}
		if c.mss > 0 && (r.MSS == 0 || r.MSS > uint32(c.mss)) {
			t.Errorf("%s: sender MSS %d with TCP_MAXSEG %d", c.name, r.MSS, c.mss)
		}
		t.Logf("%s: %v", c.name, r)
	}
	res, err := capt.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("transit capture: %s", res.Summary())
	if !res.Complete() {
		t.Errorf("capture incomplete: %s", res.Summary())
	}
	counts := res.Counts()
	// 16 MiB of TCP crossed in clear (in GSO frames of up to 64 KiB).
	clear := 0
	for _, f := range res.Frames {
		if f.Class == ClassOther && f.Proto == 6 {
			clear += f.Len
		}
	}
	if clear < 4*size {
		t.Errorf("only %d bytes of TCP in clear for 4 x %d", clear, size)
	}
	if counts[ClassESP]+counts[ClassESPInUDP] != 0 {
		t.Errorf("ESP on a plain routed line: %s", res.Summary())
	}
	leaks := res.Leaks(ClientV4.Addr(), ServerV4.Addr(), ClientV6.Addr(), ServerV6.Addr())
	if len(leaks) < counts[ClassOther]/2 {
		t.Errorf("leak detector found %d of %d cleartext frames", len(leaks), counts[ClassOther])
	}
	// Pacing holds the sender back: 2 MiB at 16 MiB/s cannot take less
	// than 125 ms (checked at half that, pacing starting with a burst).
	pr, err := Transfer(ctx, TransferOptions{From: top.Client, To: top.Server, Dst: ServerV4.Addr(), Bytes: 2 << 20, MaxRate: 16 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if pr.Duration < 62*time.Millisecond {
		t.Errorf("paced to 16 MiB/s, 2 MiB took only %v", pr.Duration)
	}
	t.Logf("paced: %v", pr)
	// A transfer to a port nobody listens on, or with a deadline that
	// cannot be met, fails with an error rather than hanging.
	short, cancel2 := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel2()
	if _, err := Transfer(short, TransferOptions{From: top.Client, To: top.Server, Dst: ServerV4.Addr(), Bytes: 1 << 30}); err == nil {
		t.Error("1 GiB in 50 ms succeeded")
	}
}

// TestTransferDetectsCorruption checks the hash comparison itself with a
// transfer over the loopback of one namespace.
func TestTransferDetectsCorruption(t *testing.T) {
	var a, b [32]byte
	if err := send(discard{}, 1000, 1, &a); err != nil {
		t.Fatal(err)
	}
	if err := send(discard{}, 1000, 2, &b); err != nil {
		t.Fatal(err)
	}
	if a == b {
		t.Fatal("two seeds give the same data")
	}
	if err := send(discard{}, 1000, 1, &b); err != nil || a != b {
		t.Fatal("one seed gives different data")
	}
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// TestProbePathMTU checks that a DF datagram too big for the transit link
// brings back the transit MTU, and that one that fits arrives.
func TestProbePathMTU(t *testing.T) {
	skipUnlessAvailable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	top := NewT(t, Options{Prefix: "etbtest", RouteLANs: true, TransitMTU: 1400})
	for _, srv := range []netip.Addr{ServerV4.Addr(), ServerV6.Addr()} {
		rx, err := top.Server.ListenUDP(netip.AddrPortFrom(srv, 0))
		if err != nil {
			t.Fatal(err)
		}
		defer rx.Close()
		ie, err := top.Client.ProbePathMTU(ctx, rx.Addr(), 1500, 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if ie == nil {
			t.Fatalf("%v: no ICMP error for 1500 bytes over a 1400 link", srv)
		}
		gw := Pick(FamilyOf(srv), GwALANV4.Addr(), GwALANV6.Addr())
		if ie.MTU != 1400 || ie.Offender != gw || ie.Errno != syscall.EMSGSIZE {
			t.Errorf("%v: %v, want mtu 1400 from %v", srv, ie, gw)
		}
		t.Logf("%v: %v", srv, ie)
		ie, err = top.Client.ProbePathMTU(ctx, rx.Addr(), 1400, 500*time.Millisecond)
		if err != nil || ie != nil {
			t.Errorf("%v: 1400 bytes: %v %v", srv, ie, err)
		}
		if err := rx.WaitPackets(ctx, 1); err != nil {
			t.Fatal(err)
		}
		hdr := Pick(FamilyOf(srv), 28, 48)
		if got := rx.Sizes(); len(got) != 1 || got[0] != 1400-hdr {
			t.Errorf("%v: received %v, want one datagram of %d", srv, got, 1400-hdr)
		}
	}
}

// TestInjectAndClassify injects forged ESP, ESP-in-UDP, IKE and keepalive
// packets from gwA and checks how a capture at gwB classifies them; then
// replays a captured packet and gets the same bytes again.
func TestInjectAndClassify(t *testing.T) {
	skipUnlessAvailable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	top := NewT(t, Options{Prefix: "etbtest"})
	// Neighbour resolution first, so the capture holds only what we send.
	for _, dst := range []netip.Addr{GwBTransitV4.Addr(), GwBTransitV6.Addr()} {
		if r, err := top.GwA.Ping(ctx, dst, PingOptions{Count: 1}); err != nil || !r.OK() {
			t.Fatalf("ping %v: %v %v", dst, r, err)
		}
	}
	capt, err := top.GwB.StartCapture(IfTransit, CaptureOptions{})
	if err != nil {
		t.Fatal(err)
	}
	type sent struct {
		class Class
		spi   uint32
	}
	var want []sent
	for _, fam := range []Family{IPv4, IPv6} {
		src := Pick(fam, GwATransitV4.Addr(), GwATransitV6.Addr())
		dst := Pick(fam, GwBTransitV4.Addr(), GwBTransitV6.Addr())
		esp := BuildESP(0xdead0001, 7, make([]byte, 48))
		udp := func(payload []byte) []byte {
			u, err := BuildUDP(src, dst, EncapPort, EncapPort, payload)
			if err != nil {
				t.Fatal(err)
			}
			return u
		}
		pkts := []struct {
			proto   uint8
			payload []byte
			want    sent
		}{
			{50, esp, sent{ClassESP, 0xdead0001}},
			{17, udp(esp), sent{ClassESPInUDP, 0xdead0001}},
			{17, udp(append([]byte{0, 0, 0, 0}, make([]byte, 28)...)), sent{ClassIKE, 0}},
			{17, udp([]byte{0xff}), sent{ClassKeepalive, 0}},
			{17, func() []byte {
				u, _ := BuildUDP(src, dst, 1234, 5678, []byte("clear"))
				return u
			}(), sent{ClassOther, 0}},
		}
		for _, p := range pkts {
			pkt, err := BuildIP(src, dst, p.proto, p.payload)
			if err != nil {
				t.Fatal(err)
			}
			if err := top.GwA.InjectIP(pkt); err != nil {
				t.Fatal(err)
			}
			want = append(want, p.want)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(incoming(capt.Frames())) < len(want) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	res, err := capt.Stop()
	if err != nil {
		t.Fatal(err)
	}
	got := incoming(res.Frames)
	if len(got) != len(want) {
		for _, f := range res.Frames {
			t.Log(f.String())
		}
		t.Fatalf("captured %d frames from gwA, want %d", len(got), len(want))
	}
	for i, f := range got {
		if f.Class != want[i].class || f.SPI != want[i].spi {
			t.Errorf("frame %d: %s, want %s spi 0x%x", i, f.String(), want[i].class, want[i].spi)
		}
	}
	// Every IPv4 header checksum and UDP checksum was right, or the gwB
	// kernel would not have answered: with nothing listening, each packet
	// brings back an ICMP protocol or port unreachable.
	unreach := 0
	for _, f := range res.Frames {
		if f.Outgoing && f.Class == ClassOther && (f.Proto == 1 || f.Proto == 58) {
			unreach++
		}
	}
	if unreach != len(want) {
		t.Errorf("%d ICMP errors from gwB, want %d", unreach, len(want))
	}

	// Replay the captured raw ESP packet: it arrives byte for byte.
	orig := got[0]
	capt, err = top.GwB.StartCapture(IfTransit, CaptureOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := top.GwA.InjectIP(orig.IP()); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for len(incoming(capt.Frames())) < 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	res, err = capt.Stop()
	if err != nil {
		t.Fatal(err)
	}
	again := incoming(res.Frames)
	if len(again) != 1 || string(again[0].Data) != string(orig.Data) {
		t.Fatalf("replay: got %d frames, first differs", len(again))
	}
	if e := again[0].ESP(); len(e) != 8+48 || e[3] != 0x01 {
		t.Errorf("ESP() = %x", e)
	}
}

// incoming returns the non-link frames that arrived from the peer.
func incoming(fr []Frame) []Frame {
	var out []Frame
	for _, f := range fr {
		if !f.Outgoing && f.Class != ClassLink {
			out = append(out, f)
		}
	}
	return out
}

// TestProcessStop checks SIGTERM, the SIGKILL fallback and the log file.
func TestProcessStop(t *testing.T) {
	skipUnlessAvailable(t)
	top := NewT(t, Options{Prefix: "etbtest"})
	dir := t.TempDir()
	p, err := top.GwA.Start(filepath.Join(dir, "ok.log"), "sh", "-c", "echo started; ip -br link show lo; exec sleep 60")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if err := p.Stop(2 * time.Second); err != nil {
		t.Errorf("stop: %v", err)
	}
	if log := p.Log(); !strings.Contains(log, "started") || !strings.Contains(log, "lo ") {
		t.Errorf("log %q", log)
	}
	stubborn, err := top.GwA.Start(filepath.Join(dir, "stubborn.log"), "sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.05; done")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	err = stubborn.Stop(300 * time.Millisecond)
	if err == nil {
		t.Error("a process ignoring SIGTERM was reported as stopped cleanly")
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("Stop took %v", time.Since(start))
	}
	if done, _ := stubborn.Exited(); !done {
		t.Error("still running after SIGKILL")
	}
	failing, err := top.GwA.Start(filepath.Join(dir, "fail.log"), "sh", "-c", "exit 3")
	if err != nil {
		t.Fatal(err)
	}
	<-failing.Done()
	if code, ok := failing.ExitCode(); !ok || code != 3 {
		t.Errorf("exit code %d %v", code, ok)
	}
	if err := failing.Signal(syscall.SIGHUP); err == nil {
		t.Error("signal to an exited process succeeded")
	}
	if err := failing.Stop(0); err == nil {
		t.Error("Stop of a process that failed reports no error")
	}
}
