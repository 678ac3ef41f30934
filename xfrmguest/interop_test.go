package xfrmguest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// TestInteropAES128GCM keys espd (in the test namespace, outer 198.18.0.1)
// and the guest's kernel XFRM (outer 198.18.0.2) with the same pair of
// aes128gcm16 raw ESP tunnel SAs between 198.18.2.1 (behind espd) and
// 198.18.3.1 (in the guest), pings both ways and checks that the guest's
// inbound state counted the packets espd sent.
func TestInteropAES128GCM(t *testing.T) {
	node, g := bootT(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	sock := filepath.Join(dir, "espd.sock")
	proc, err := node.Start(filepath.Join(dir, "espd.log"), espdBin, "--tun", "esp0", "--socket", sock,
		"--state-dir", filepath.Join(dir, "state"), "--workers", "1", "--log-format", "text")
	if err != nil {
		t.Fatal(err)
	}
	if err := testbed.WaitEspd(ctx, node, proc, sock, "esp0"); err != nil {
		t.Fatalf("%v\n%s", err, proc.Log())
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("espd logged:\n%s", testbed.Tail(proc.Log(), 40))
		}
	})

	// 16 bytes of AES key and 4 of salt per direction, random per run.
	keyOut, keyIn := make([]byte, 20), make([]byte, 20)
	rand.Read(keyOut)
	rand.Read(keyIn)
	keyFile := func(k []byte) string {
		f := filepath.Join(dir, fmt.Sprintf("k%d.key", time.Now().UnixNano()))
		if err := os.WriteFile(f, []byte(hex.EncodeToString(k)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	ctl := func(args ...string) {
		t.Helper()
		if out, err := testbed.Espctl(nil, espctlBin, sock, args...); err != nil {
			t.Fatalf("espctl %v: %v\n%s", args, err, out)
		}
	}
	ctl("sa", "add", "--spi", "0x2001", "--dir", "out", "--src", "198.18.0.1", "--dst", "198.18.0.2",
		"--enc", "aes128gcm16", "--enc-key-file", keyFile(keyOut), "--reqid", "1")
	ctl("sa", "add", "--spi", "0x2002", "--dir", "in", "--src", "198.18.0.2", "--dst", "198.18.0.1",
		"--enc", "aes128gcm16", "--enc-key-file", keyFile(keyIn), "--reqid", "1")
	ctl("policy", "add", "--src", "198.18.2.1/32", "--dst", "198.18.3.1/32", "--dir", "out", "--action", "protect", "--reqid", "1")
	ctl("policy", "add", "--src", "198.18.3.1/32", "--dst", "198.18.2.1/32", "--dir", "in", "--action", "protect", "--reqid", "1")
	node.MustIP(t, "addr", "add", "198.18.2.1/32", "dev", "lo")

	// In the guest, the keys are on ip's command line: the guest is a
	// throwaway VM and iproute2 reads keys no other way.
	for _, cmd := range []string{
		"ip addr add 198.18.3.1/32 dev lo",
		"ip route add 198.18.2.1/32 via 198.18.0.1 src 198.18.3.1",
		"ip xfrm state add src 198.18.0.1 dst 198.18.0.2 proto esp spi 0x2001 reqid 1 mode tunnel aead 'rfc4106(gcm(aes))' 0x" + hex.EncodeToString(keyOut) + " 128",
		"ip xfrm state add src 198.18.0.2 dst 198.18.0.1 proto esp spi 0x2002 reqid 1 mode tunnel aead 'rfc4106(gcm(aes))' 0x" + hex.EncodeToString(keyIn) + " 128",
		"ip xfrm policy add src 198.18.3.1/32 dst 198.18.2.1/32 dir out tmpl src 198.18.0.2 dst 198.18.0.1 proto esp reqid 1 mode tunnel",
		"ip xfrm policy add src 198.18.2.1/32 dst 198.18.3.1/32 dir in tmpl src 198.18.0.1 dst 198.18.0.2 proto esp reqid 1 mode tunnel",
	} {
		if _, err := g.MustRun(ctx, cmd); err != nil {
			t.Fatal(err)
		}
	}

	res, err := node.Ping(ctx, netip.MustParseAddr("198.18.3.1"), testbed.PingOptions{
		Count: 3, Wait: 5 * time.Second, Source: netip.MustParseAddr("198.18.2.1")})
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK() {
		out, _, _ := g.Run(ctx, "ip -s xfrm state; cat /proc/net/xfrm_stat")
		t.Fatalf("espd -> guest: %d of %d answered:\n%s\nguest:\n%s", res.Received, res.Transmitted, res.Output, out)
	}
	out, err := g.MustRun(ctx, "ping -c 3 -W 5 -I 198.18.3.1 198.18.2.1")
	if err != nil {
		t.Fatalf("guest -> espd: %v", err)
	}
	t.Logf("guest's ping:\n%s", out)
	for _, spi := range []string{"0x2001", "0x2002"} {
		src, dst := "198.18.0.1", "198.18.0.2"
		if spi == "0x2002" {
			src, dst = dst, src
		}
		out, err := g.MustRun(ctx, "ip -s xfrm state get src "+src+" dst "+dst+" proto esp spi "+spi)
		if err != nil {
			t.Fatal(err)
		}
		// 3 echo requests and 3 replies each way: 6 packets per SA.
		if n := packets(out); n < 6 {
			t.Errorf("guest's state %s counted %d packets, want at least 6:\n%s", spi, n, out)
		}
	}
	// Every error counter of the guest's XFRM stays 0.
	out, err = g.MustRun(ctx, "cat /proc/net/xfrm_stat")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range statRE.FindAllStringSubmatch(out, -1) {
		if m[2] != "0" {
			t.Errorf("guest's %s is %s", m[1], m[2])
		}
	}
}

var statRE = regexp.MustCompile(`(?m)^(Xfrm\w+)\s+(\d+)$`)

var packetsRE = regexp.MustCompile(`(\d+)\(bytes\), (\d+)\(packets\)`)

// packets returns the packet count of "ip -s xfrm state" output's
// "lifetime current" line (-1 if there is none).
func packets(s string) int {
	m := packetsRE.FindAllStringSubmatch(s, -1)
	if len(m) == 0 {
		return -1
	}
	n, _ := strconv.Atoi(m[len(m)-1][2])
	return n
}
