package e2e

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// rbGatewayConf is a gateway's configuration of one route-based tunnel
// (docs/config.md's route-based example): interface name with mtu (0:
// none given), its two states and the 0/0 policies of if_id 1.
func rbGatewayConf(name string, mtu int, local, peer netip.Addr, spiOut, spiIn uint32, keyOut, keyIn []byte) string {
	var b strings.Builder
	fmt.Fprintf(&b, "[[interface]]\nname = %q\nif_id = 1\n", name)
	if mtu != 0 {
		fmt.Fprintf(&b, "mtu = %d\n", mtu)
	}
	for _, s := range []struct {
		spi      uint32
		dir      string
		src, dst netip.Addr
		key      []byte
	}{{spiOut, "out", local, peer, keyOut}, {spiIn, "in", peer, local, keyIn}} {
		fmt.Fprintf(&b, "\n[[sa]]\nspi = 0x%x\ndir = %q\nsrc = %q\ndst = %q\nsuite = \"aes128gcm16\"\nenc_key = \"0x%s\"\nreqid = 2\nif_id = 1\n",
			s.spi, s.dir, s.src, s.dst, hex.EncodeToString(s.key))
	}
	for _, dir := range []string{"out", "in"} {
		fmt.Fprintf(&b, "\n[[policy]]\nsrc = \"0.0.0.0/0\"\ndst = \"0.0.0.0/0\"\ndir = %q\nreqid = 2\nif_id = 1\n", dir)
	}
	return b.String()
}

// linkPackets reads an interface's tx packets counter in n (what the
// kernel routed into it: what espd read from it).
func linkPackets(t *testing.T, n *testbed.Node, name string) int {
	t.Helper()
	var links []struct {
		Stats struct {
			TX struct {
				Packets int `json:"packets"`
			} `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal([]byte(n.MustIP(t, "-j", "-s", "link", "show", name)), &links); err != nil || len(links) != 1 {
		t.Fatalf("ip -j -s link show %s: %v", name, err)
	}
	return links[0].Stats.TX.Packets
}

// TestRouteBasedReloadUnderTraffic: a route-based tunnel between the
// gateways (LAN B routed into rb1 on A, LAN A into rb1 on B), a default
// route on A towards the transit link, 20 echo requests a second from the
// client to the server through the tunnel. A reload on A that changes
// rb1's mtu changes it in place (same interface, the route kept); one
// that renames rb1 is refused with its message and changes nothing. The
// transit link, captured throughout, carries not one cleartext frame of
// the LANs, and the pings keep being answered.
func TestRouteBasedReloadUnderTraffic(t *testing.T) {
	top := newTopology(t, 0)
	defaultRoutes(t, top)
	aOut, bOut := testbed.GwATransitV4.Addr(), testbed.GwBTransitV4.Addr()
	kab, kba := randKey(t, keyLens["aes128gcm16"][0]), randKey(t, keyLens["aes128gcm16"][0])
	confA := filepath.Join(t.TempDir(), "espd-a.toml")
	confB := filepath.Join(t.TempDir(), "espd-b.toml")
	writeConf := func(path, conf string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeConf(confA, rbGatewayConf("rb1", 0, aOut, bOut, 0x1101, 0x3101, kab, kba))
	writeConf(confB, rbGatewayConf("rb1", 0, bOut, aOut, 0x3101, 0x1101, kba, kab))
	a := startEspd(t, top.GwA, "--config", confA)
	startEspd(t, top.GwB, "--config", confB)
	top.GwA.MustIP(t, "route", "add", testbed.LANBV4.String(), "dev", "rb1")
	top.GwB.MustIP(t, "route", "add", testbed.LANAV4.String(), "dev", "rb1")
	index := strings.SplitN(top.GwA.MustIP(t, "-o", "link", "show", "rb1"), ":", 2)[0]

	c, err := top.GwA.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	const count = 300 // 15 s at 20 a second
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var pingOut string
	var pingErr error
	pingDone := make(chan struct{})
	go func() {
		defer close(pingDone)
		pingOut, pingErr = top.Client.Run(ctx, "ping", "-n", "-4", "-c", fmt.Sprint(count), "-i", "0.05", "-W", "1",
			serverAddr(testbed.IPv4).String())
	}()
	// progress waits until 20 more packets went into rb1 on A.
	progress := func(what string) {
		t.Helper()
		from := linkPackets(t, top.GwA, "rb1")
		if !eventually(30*time.Second, func() bool { return linkPackets(t, top.GwA, "rb1") >= from+20 }) {
			t.Fatalf("%s: no traffic into rb1", what)
		}
	}
	hup := func(conf, logged string) {
		t.Helper()
		writeConf(confA, conf)
		if err := a.proc.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		if !eventually(30*time.Second, func() bool { return a.logContains(logged) }) {
			t.Fatalf("espd on A did not log %q after SIGHUP", logged)
		}
	}
	intact := func(when string, mtu int) {
		t.Helper()
		l := top.GwA.MustIP(t, "-o", "link", "show", "rb1")
		if !strings.HasPrefix(l, index+":") || !strings.Contains(l, fmt.Sprintf(" mtu %d ", mtu)) {
			t.Errorf("%s: %s; want rb1 with index %s and mtu %d", when, l, index, mtu)
		}
		if r := top.GwA.MustIP(t, "route", "show", testbed.LANBV4.String()); !strings.Contains(r, "dev rb1") {
			t.Errorf("%s: the route into rb1 is gone: %q", when, r)
		}
	}
	progress("before the reloads")
	hup(rbGatewayConf("rb1", 1380, aOut, bOut, 0x1101, 0x3101, kab, kba), "MTU changed in place")
	intact("mtu 1380", 1380)
	progress("after the MTU change")
	hup(rbGatewayConf("rb9", 1380, aOut, bOut, 0x1101, 0x3101, kab, kba), "renaming rb1 to rb9 is refused")
	intact("rename refused", 1380)
	if _, err := top.GwA.IP(ctx, "link", "show", "rb9"); err == nil {
		t.Error("a refused rename created rb9")
	}
	progress("after the refused rename")
	select {
	case <-pingDone:
	case <-time.After(90 * time.Second):
		t.Fatal("ping did not end")
	}
	a.alive(t)
	res, err := c.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("gwA transit: %s; ping: %s", res.Summary(), tail(pingOut, 3))
	if !res.Complete() {
		t.Errorf("capture incomplete: %d dropped, %d over the limit", res.Drops, res.Overflow)
	}
	leaks := res.Leaks(clientAddr(testbed.IPv4), serverAddr(testbed.IPv4))
	for i, f := range leaks {
		if i == 10 {
			break
		}
		t.Errorf("cleartext on transit: %s", f.String())
	}
	if len(leaks) > 0 {
		t.Errorf("%d cleartext frames on the transit link across the reloads", len(leaks))
	}
	answered := strings.Count(pingOut, " bytes from ")
	if pingErr != nil && answered == 0 {
		t.Fatalf("ping: %v\n%s", pingErr, tail(pingOut, 5))
	}
	if lost := count - answered; lost > count/20 {
		t.Errorf("%d of %d echo requests lost across the reloads", lost, count)
	}
}
