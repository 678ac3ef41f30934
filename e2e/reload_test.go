package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// reloadFile renders a gateway's configuration file for
// TestReloadSuiteSameKey: one outbound and one inbound state of the given
// suite, and protect policies for the IPv4 LANs.
func reloadFile(suite string, out, in uint32, local, remote netip.Addr, outKey, inKey []byte, lanLocal, lanRemote netip.Prefix) string {
	var b strings.Builder
	for _, s := range []struct {
		spi      uint32
		dir      string
		src, dst netip.Addr
		key      []byte
	}{{out, "out", local, remote, outKey}, {in, "in", remote, local, inKey}} {
		fmt.Fprintf(&b, "[[sa]]\nspi = 0x%x\ndir = %q\nsrc = %q\ndst = %q\nsuite = %q\nenc_key = \"0x%s\"\nreqid = 1\n\n",
			s.spi, s.dir, s.src, s.dst, suite, hex.EncodeToString(s.key))
	}
	fmt.Fprintf(&b, "[[policy]]\nsrc = %q\ndst = %q\ndir = \"out\"\nreqid = 1\n\n", lanLocal, lanRemote)
	fmt.Fprintf(&b, "[[policy]]\nsrc = %q\ndst = %q\ndir = \"in\"\nreqid = 1\n", lanRemote, lanLocal)
	return b.String()
}

// TestReloadSuiteSameKey reloads both gateways' configuration files while
// UDP flows both ways through the tunnel, changing only the suite of the
// SAs under the same keys: aes128gcm16, then aes128gcm16-esn, then
// aes128gcm12. Each reload replaces the states; the capture of the transit
// link must show no (SPI, sequence number) pair twice (with the same key,
// a repeat is a repeated AES-GCM nonce), numbers that go on across each
// reload, and the tunnel carrying traffic after each of them.
func TestReloadSuiteSameKey(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	top := newTopology(t, 0)
	a4, b4 := testbed.GwATransitV4.Addr(), testbed.GwBTransitV4.Addr()
	keyAB, keyBA := randKey(t, 20), randKey(t, 20)
	files := func(suite string) (string, string) {
		return reloadFile(suite, spiAB, spiBA, a4, b4, keyAB, keyBA, testbed.LANAV4, testbed.LANBV4),
			reloadFile(suite, spiBA, spiAB, b4, a4, keyBA, keyAB, testbed.LANBV4, testbed.LANAV4)
	}
	dir := t.TempDir()
	pathA, pathB := filepath.Join(dir, "gwa.toml"), filepath.Join(dir, "gwb.toml")
	fa, fb := files("aes128gcm16")
	writeSecret(t, pathA, fa)
	writeSecret(t, pathB, fb)
	a := startEspd(t, top.GwA, "--config", pathA)
	b := startEspd(t, top.GwB, "--config", pathB)
	ping(t, ctx, top, testbed.IPv4, false)

	capt, err := top.GwB.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 96})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if capt != nil {
			capt.Stop()
		}
	}()

	// UDP both ways, one datagram per millisecond each, for as long as the
	// reloads take.
	const port = 41001
	up, err := top.Server.ListenUDP(netip.AddrPortFrom(serverAddr(testbed.IPv4), port))
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	down, err := top.Client.ListenUDP(netip.AddrPortFrom(clientAddr(testbed.IPv4), port))
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	flowCtx, stopFlow := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, f := range []struct {
		from *testbed.Node
		to   netip.Addr
	}{{top.Client, serverAddr(testbed.IPv4)}, {top.Server, clientAddr(testbed.IPv4)}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.from.SendUDP(flowCtx, netip.AddrPortFrom(f.to, port), testbed.UDPSendOptions{Size: 200, Count: 60000, Interval: time.Millisecond})
		}()
	}
	defer func() { stopFlow(); wg.Wait() }()
	flowing := func(what string) {
		t.Helper()
		u, d := up.Packets(), down.Packets()
		if !eventually(15*time.Second, func() bool { return up.Packets() >= u+500 && down.Packets() >= d+500 }) {
			t.Fatalf("%s: the tunnel carried %d datagrams up and %d down in 15 s", what, up.Packets()-u, down.Packets()-d)
		}
	}
	flowing("before the reloads")

	for _, suite := range []string{"aes128gcm16-esn", "aes128gcm12"} {
		fa, fb := files(suite)
		writeSecret(t, pathA, fa)
		writeSecret(t, pathB, fb)
		for _, e := range []*espd{a, b} {
			if err := e.proc.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
		}
		for _, c := range []struct {
			e   *espd
			spi uint32
			dst netip.Addr
		}{{a, spiAB, b4}, {b, spiBA, a4}} {
			var alg string
			if !eventually(10*time.Second, func() bool {
				alg = c.e.saAlg(t, c.spi, c.dst)
				return alg == suite
			}) {
				t.Fatalf("%s after SIGHUP: state 0x%x has suite %q, want %q\n%s", c.e.node.Role, c.spi, alg, suite, tail(c.e.proc.Log(), 20))
			}
		}
		flowing("after the reload to " + suite)
	}
	stopFlow()
	wg.Wait()
	ping(t, ctx, top, testbed.IPv4, false)
	res, err := capt.Stop()
	capt = nil
	if err != nil {
		t.Fatal(err)
	}
	if !res.Complete() {
		t.Fatalf("incomplete capture: %s", res.Summary())
	}

	// Every ESP packet of an SPI (one key for the whole test) has a
	// sequence number of its own. Few enough packets are sent that the
	// high 32 bits of the ESN are 0.
	for _, spi := range []uint32{spiAB, spiBA} {
		seen := map[uint32]int{}
		var order []uint32
		for _, f := range res.Frames {
			if f.Class != testbed.ClassESP || f.SPI != spi {
				continue
			}
			seen[f.Seq]++
			order = append(order, f.Seq)
		}
		if len(order) < 1000 {
			t.Fatalf("SPI 0x%x: only %d ESP packets captured (%s)", spi, len(order), res.Summary())
		}
		var repeats []string
		for seq, n := range seen {
			if n > 1 {
				repeats = append(repeats, fmt.Sprintf("%d (x%d)", seq, n))
			}
		}
		if len(repeats) > 0 {
			t.Errorf("SPI 0x%x, one key: %d sequence numbers sent more than once, e.g. %v", spi, len(repeats), repeats[:min(len(repeats), 10)])
		}
		// And they go on: the capture sees them in the order the
		// gateway sent them.
		back := 0
		for i := 1; i < len(order); i++ {
			if order[i] <= order[i-1] {
				back++
			}
		}
		if back > 0 {
			t.Errorf("SPI 0x%x: sequence numbers went back %d times", spi, back)
		}
		t.Logf("SPI 0x%x: %d ESP packets, sequence numbers %d to %d", spi, len(order), order[0], order[len(order)-1])
	}
}

// saAlg returns the suite of a state as espctl names it ("" if not
// found).
func (e *espd) saAlg(t *testing.T, spi uint32, dst netip.Addr) string {
	t.Helper()
	out, err := e.ctl(append([]string{"--json"}, saGetArgs("get", spi, dst)...)...)
	if err != nil {
		return ""
	}
	v, err := decodeJSON(out)
	if err != nil {
		return ""
	}
	if m, ok := v.(map[string]any); ok {
		s, _ := m["alg"].(string)
		return s
	}
	return ""
}
