package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// fileSA is one [[sa]] table of a configuration file.
type fileSA struct {
	spi      uint32
	dir      string
	src, dst netip.Addr
	suite    string
	key      []byte
}

// gatewayFile renders a gateway's configuration file: its outbound and
// inbound states and, for each LAN family, an out and an in policy from
// local to remote.
func gatewayFile(sas []fileSA, local, remote []netip.Prefix) string {
	var b strings.Builder
	b.WriteString("# written by espd's e2e tests\n")
	for _, s := range sas {
		key := "0x" + hex.EncodeToString(s.key)
		fmt.Fprintf(&b, "\n[[sa]]\nspi = 0x%x\ndir = %q\nsrc = %q\ndst = %q\nsuite = %q\nenc_key = %q\nreqid = 1\n",
			s.spi, s.dir, s.src, s.dst, s.suite, key)
		if s.dir == "in" {
			b.WriteString("replay_window = 64\n")
		}
	}
	for i := range local {
		fmt.Fprintf(&b, "\n[[policy]]\nsrc = %q\ndst = %q\ndir = \"out\"\nreqid = 1\n", local[i], remote[i])
		fmt.Fprintf(&b, "\n[[policy]]\nsrc = %q\ndst = %q\ndir = \"in\"\nreqid = 1\n", remote[i], local[i])
	}
	return b.String()
}

// TestConfigFile keys the tunnel with configuration files (ChaCha20-Poly1305,
// IPv4 LANs), runs a ping and 20 MiB each way, then edits both files (new
// SPIs and keys, IPv6 LANs added) and sends SIGHUP: the new states replace
// the old ones, IPv6 starts to work, and a state added with espctl stays.
// Finally an invalid file on SIGHUP is refused with its line number, the
// running states are untouched and forwarding continues.
func TestConfigFile(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	const suite = "chacha20poly1305"
	top := newTopology(t, 0)
	a4, b4 := testbed.GwATransitV4.Addr(), testbed.GwBTransitV4.Addr()
	keyAB, keyBA := randKey(t, 36), randKey(t, 36)
	allKeys := [][]byte{keyAB, keyBA}
	files := func(ab, ba uint32, fams []testbed.Family) (string, string) {
		var lanA, lanB []netip.Prefix
		for _, f := range fams {
			lanA = append(lanA, testbed.Pick(f, testbed.LANAV4, testbed.LANAV6))
			lanB = append(lanB, testbed.Pick(f, testbed.LANBV4, testbed.LANBV6))
		}
		fa := gatewayFile([]fileSA{
			{spi: ab, dir: "out", src: a4, dst: b4, suite: suite, key: keyAB},
			{spi: ba, dir: "in", src: b4, dst: a4, suite: suite, key: keyBA},
		}, lanA, lanB)
		fb := gatewayFile([]fileSA{
			{spi: ba, dir: "out", src: b4, dst: a4, suite: suite, key: keyBA},
			{spi: ab, dir: "in", src: a4, dst: b4, suite: suite, key: keyAB},
		}, lanB, lanA)
		return fa, fb
	}
	dir := t.TempDir()
	pathA, pathB := filepath.Join(dir, "gwa.toml"), filepath.Join(dir, "gwb.toml")
	fa, fb := files(spiAB, spiBA, []testbed.Family{testbed.IPv4})
	writeSecret(t, pathA, fa)
	writeSecret(t, pathB, fb)
	a := startEspd(t, top.GwA, "--config", pathA)
	b := startEspd(t, top.GwB, "--config", pathB)

	ping(t, ctx, top, testbed.IPv4, false)
	transfer(t, ctx, top, testbed.IPv4, true, bigTransfer)
	transfer(t, ctx, top, testbed.IPv4, false, bigTransfer)
	// No IPv6 policy yet: IPv6 between the LANs goes nowhere.
	if r, err := top.Client.Ping(ctx, serverAddr(testbed.IPv6), testbed.PingOptions{Count: 1, Wait: time.Second}); err != nil || r.Received != 0 {
		t.Fatalf("IPv6 ping before the reload: %+v %v", r, err)
	}

	// A state added through the control socket, which reloads must leave.
	const ctlSPI = 0x3001
	a.addSA(t, saSpec{spi: ctlSPI, dir: "in", src: b4, dst: a4, suite: "aes128gcm16", encKey: randKey(t, 20), reqid: 7})

	// Rekey both files to new SPIs and keys, and add the IPv6 LANs.
	const newAB, newBA uint32 = 0x1002, 0x2002
	keyAB, keyBA = randKey(t, 36), randKey(t, 36)
	allKeys = append(allKeys, keyAB, keyBA)
	fa, fb = files(newAB, newBA, []testbed.Family{testbed.IPv4, testbed.IPv6})
	writeSecret(t, pathA, fa)
	writeSecret(t, pathB, fb)
	for _, e := range []*espd{a, b} {
		if err := e.proc.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	want := map[*espd][]uint32{a: {newAB, newBA, ctlSPI}, b: {newAB, newBA}}
	for e, spis := range want {
		var got map[uint32]bool
		ok := eventually(10*time.Second, func() bool {
			got = e.spis(t)
			return sameSPIs(got, spis)
		})
		if !ok {
			t.Fatalf("%s after SIGHUP: states %v, want %#x", e.node.Role, keys(got), spis)
		}
	}
	capt, err := top.GwB.StartCapture(testbed.IfTransit, testbed.CaptureOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		ping(t, ctx, top, f, false)
	}
	res, err := capt.Stop()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[uint32]int{}
	for _, f := range res.Frames {
		if f.Class == testbed.ClassESP {
			seen[f.SPI]++
		}
	}
	if seen[newAB] == 0 || seen[newBA] == 0 || seen[spiAB] != 0 || seen[spiBA] != 0 {
		t.Errorf("SPIs on transit after the rekey: %v (%s)", seen, res.Summary())
	}

	// An invalid file: gwA's outbound key is 3 bytes short.
	bad := strings.Replace(fa, "0x"+hex.EncodeToString(keyAB), "0x"+hex.EncodeToString(keyAB[:33]), 1)
	if bad == fa {
		t.Fatal("could not break the file")
	}
	writeSecret(t, pathA, bad)
	logBefore := len(a.proc.Log())
	if err := a.proc.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	lineRef := regexp.MustCompile(`gwa\.toml:\d+`)
	var refusal string
	if !eventually(10*time.Second, func() bool {
		refusal = lineRef.FindString(a.proc.Log()[logBefore:])
		return refusal != ""
	}) {
		t.Fatalf("no error naming gwa.toml:<line> in the log after an invalid file:\n%s", a.proc.Log()[logBefore:])
	}
	for line := range strings.SplitSeq(a.proc.Log()[logBefore:], "\n") {
		if strings.Contains(line, refusal) {
			t.Logf("gwA refused the invalid file: %s", line)
		}
	}
	a.alive(t)
	if got := a.spis(t); !sameSPIs(got, want[a]) {
		t.Errorf("states after the invalid file: %v", keys(got))
	}
	for _, f := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		ping(t, ctx, top, f, false)
		transfer(t, ctx, top, f, true, smallTransfer)
		transfer(t, ctx, top, f, false, smallTransfer)
	}
	a.alive(t)
	b.alive(t)
	// Not even the refusal of the broken key shows a key.
	for _, e := range []*espd{a, b} {
		log := strings.ToLower(e.proc.Log())
		for _, k := range append(allKeys, keyAB[:33]) {
			if strings.Contains(log, hex.EncodeToString(k)) {
				t.Errorf("espd on %s logged a key from the file", e.node.Role)
			}
		}
	}
}

// sameSPIs reports whether got holds exactly the SPIs in want.
func sameSPIs(got map[uint32]bool, want []uint32) bool {
	if len(got) != len(want) {
		return false
	}
	for _, spi := range want {
		if !got[spi] {
			return false
		}
	}
	return true
}

func keys(m map[uint32]bool) []string {
	var s []string
	for k := range m {
		s = append(s, fmt.Sprintf("0x%x", k))
	}
	return s
}

// TestDefaultsAgree starts espd with a configuration file that sets nothing
// optional, its keys in key files, and adds the same states with espctl and
// no options: espd must hold the same configuration for both, with anti-
// replay (sa.DefaultReplayWindow) and ECN on. SPIs below 256 and windows
// above the maximum are refused by both paths.
func TestDefaultsAgree(t *testing.T) {
	top := newTopology(t, 0)
	a4, b4 := testbed.GwATransitV4.Addr(), testbed.GwBTransitV4.Addr()
	dir := t.TempDir()
	keyIn, keyOut := randKey(t, 20), randKey(t, 20)
	if err := os.Mkdir(filepath.Join(dir, "keys"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeSecret(t, filepath.Join(dir, "keys", "in.key"), "0x"+hex.EncodeToString(keyIn)+"\n")
	writeSecret(t, filepath.Join(dir, "keys", "out.key"), hex.EncodeToString(keyOut[:10])+"\n"+hex.EncodeToString(keyOut[10:])+"\n")
	file := fmt.Sprintf(`
[[sa]]
spi = 0x1101
dir = "in"
src = %q
dst = %q
suite = "aes128gcm16"
enc_key_file = "keys/in.key"

[[sa]]
spi = 0x1102
dir = "out"
src = %q
dst = %q
suite = "aes128gcm16"
enc_key_file = "keys/out.key"
`, b4, a4, a4, b4)
	path := filepath.Join(dir, "gwa.toml")
	writeSecret(t, path, file)
	a := startEspd(t, top.GwA, "--config", path)
	// The same states but for their SPIs and keys (every SA needs its own).
	a.addSA(t, saSpec{spi: 0x1201, dir: "in", src: b4, dst: a4, suite: "aes128gcm16", encKey: randKey(t, 20)})
	a.addSA(t, saSpec{spi: 0x1202, dir: "out", src: a4, dst: b4, suite: "aes128gcm16", encKey: randKey(t, 20)})

	get := func(spi uint32, dst netip.Addr) map[string]any {
		v, ok := a.ctlJSON(t, saGetArgs("get", spi, dst)...).(map[string]any)
		if !ok {
			t.Fatalf("sa get 0x%x: not an object", spi)
		}
		delete(v, "spi")
		delete(v, "spi_hex")
		delete(v, "stats")
		return v
	}
	for _, p := range []struct {
		file, ctl uint32
		dst       netip.Addr
	}{{0x1101, 0x1201, a4}, {0x1102, 0x1202, b4}} {
		fromFile, fromCtl := get(p.file, p.dst), get(p.ctl, p.dst)
		if !reflect.DeepEqual(fromFile, fromCtl) {
			t.Errorf("state 0x%x from the file and 0x%x from espctl differ:\n file   %v\n espctl %v", p.file, p.ctl, fromFile, fromCtl)
		}
		if fmt.Sprint(fromFile["replay_window"]) != "128" || fromFile["ecn"] != true || fromFile["copy_dscp"] != true || fromFile["df"] != "copy" {
			t.Errorf("state 0x%x: %v, want replay window 128, ecn, dscp copy, df copy", p.file, fromFile)
		}
	}

	// Refusals through espctl...
	for _, c := range []struct {
		spec saSpec
		want string
	}{
		{saSpec{spi: 255, dir: "in", src: b4, dst: a4, suite: "aes128gcm16", encKey: randKey(t, 20)}, "SPI 255 is reserved"},
		{saSpec{spi: 0x1301, dir: "in", src: b4, dst: a4, suite: "aes128gcm16", encKey: randKey(t, 20), replayWindow: 65537}, "replay window 65537 is above the maximum of 65536"},
	} {
		args := c.spec.args()
		out, err := a.ctl(args...)
		removeKeyFiles(args)
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("espctl sa add spi 0x%x: %v %q, want %q", c.spec.spi, err, out, c.want)
		}
	}
	// ... and the file, on SIGHUP: refused whole, naming the line.
	writeSecret(t, path, file+fmt.Sprintf("\n[[sa]]\nspi = 7\ndir = \"in\"\nsrc = %q\ndst = %q\nsuite = \"aes128gcm16\"\nenc_key = \"%x\"\n", b4, a4, randKey(t, 20)))
	logBefore := len(a.proc.Log())
	if err := a.proc.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if !eventually(10*time.Second, func() bool {
		return testbed.CountLines(a.proc.Log()[logBefore:], "gwa.toml:", "SPI 7 is reserved") > 0
	}) {
		t.Errorf("no refusal of SPI 7 in the log:\n%s", tail(a.proc.Log()[logBefore:], 20))
	}
	// A key file others can read is refused.
	os.Chmod(filepath.Join(dir, "keys", "in.key"), 0o644)
	writeSecret(t, path, file)
	logBefore = len(a.proc.Log())
	if err := a.proc.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if !eventually(10*time.Second, func() bool {
		return testbed.CountLines(a.proc.Log()[logBefore:], "gwa.toml:", "in.key", "accessible to other users") > 0
	}) {
		t.Errorf("no refusal of the world-readable key file in the log:\n%s", tail(a.proc.Log()[logBefore:], 20))
	}
	if got := a.spis(t); !sameSPIs(got, []uint32{0x1101, 0x1102, 0x1201, 0x1202}) {
		t.Errorf("states after the refused files: %v", keys(got))
	}
	a.alive(t)
}
