package e2e

import (
	"context"
	"debug/buildinfo"
	"encoding/hex"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// installedExample is the example configuration the espd package ships.
const installedExample = "/usr/share/doc/espd/examples/espd.toml"

// TestInstalled is the smoke test of the espd package (README.md,
// "Packages"); it runs only with ESPD_INSTALLED=1, which makes TestMain use
// /usr/sbin/espd and /usr/bin/espctl instead of building them. It checks
// that both binaries belong to the installed espd package and were built as
// it promises (GOEXPERIMENT=runtimesecret), then runs a tunnel between two
// gateway namespaces: gateway A keyed by the package's example
// configuration as shipped (with two fresh key files beside it), gateway B
// by the installed espctl. Pings and a TCP transfer cross it both ways, the
// transit link carries them only as ESP under the example's SPIs, and
// espctl reads the counters of both ends.
func TestInstalled(t *testing.T) {
	if !testbed.Installed() {
		t.Skipf("tests the installed espd package; set %s=1 (README.md, \"Packages\")", testbed.InstalledEnv)
	}
	for _, p := range []string{espdBin, espctlBin} {
		out, err := exec.Command("dpkg-query", "-S", p).CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), "espd: ") {
			t.Fatalf("%s does not belong to the espd package: dpkg-query -S: %v\n%s", p, err, out)
		}
		bi, err := buildinfo.ReadFile(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		var experiment string
		for _, s := range bi.Settings {
			if s.Key == "GOEXPERIMENT" {
				experiment = s.Value
			}
		}
		if !strings.Contains(","+experiment+",", ",runtimesecret,") {
			t.Errorf("%s was built with GOEXPERIMENT=%q, not runtimesecret", p, experiment)
		}
	}
	example, err := os.ReadFile(installedExample)
	if err != nil {
		t.Fatalf("the package's example configuration: %v", err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	top := newTopology(t, 0)
	// The example's addresses are the test bed's: gateway A 198.18.0.1 with
	// LAN 198.18.1.0/24, gateway B 198.18.0.2 with LAN 198.18.2.0/24, SPIs
	// 0x1001 (A to B) and 0x2001, aes128gcm16, key files keys/ab.key and
	// keys/ba.key beside the file.
	a4, b4 := testbed.GwATransitV4.Addr(), testbed.GwBTransitV4.Addr()
	keyAB, keyBA := randKey(t, 20), randKey(t, 20)
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "keys"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeSecret(t, filepath.Join(dir, "keys", "ab.key"), hex.EncodeToString(keyAB)+"\n")
	writeSecret(t, filepath.Join(dir, "keys", "ba.key"), hex.EncodeToString(keyBA)+"\n")
	conf := filepath.Join(dir, "espd.toml")
	writeSecret(t, conf, string(example))

	a := startEspd(t, top.GwA, "--config", conf)
	b := startEspd(t, top.GwB)
	const suite = "aes128gcm16"
	b.addSA(t, saSpec{spi: spiBA, dir: "out", src: b4, dst: a4, suite: suite, encKey: keyBA, reqid: 1})
	b.addSA(t, saSpec{spi: spiAB, dir: "in", src: a4, dst: b4, suite: suite, encKey: keyAB, reqid: 1})
	b.addPolicy(t, policySpec{src: testbed.LANBV4, dst: testbed.LANAV4, dir: "out", action: "protect", reqid: 1})
	b.addPolicy(t, policySpec{src: testbed.LANAV4, dst: testbed.LANBV4, dir: "in", action: "protect", reqid: 1})

	capt, err := top.GwB.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 96})
	if err != nil {
		t.Fatal(err)
	}
	ping(t, ctx, top, testbed.IPv4, false)
	ping(t, ctx, top, testbed.IPv4, true)
	transfer(t, ctx, top, testbed.IPv4, true, smallTransfer)
	transfer(t, ctx, top, testbed.IPv4, false, smallTransfer)
	res, err := capt.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if res.Counts()[testbed.ClassOther] > 0 {
		t.Errorf("traffic in clear on the transit link: %s", res.Summary())
	}
	spis := map[uint32]int{}
	for _, f := range res.Frames {
		if f.Class == testbed.ClassESP {
			spis[f.SPI]++
		}
	}
	if spis[spiAB] == 0 || spis[spiBA] == 0 || len(spis) != 2 {
		t.Errorf("ESP SPIs on the transit link: %v, want 0x%x and 0x%x (%s)", spis, spiAB, spiBA, res.Summary())
	}

	// The installed espctl reads what crossed: every state counted packets.
	for _, c := range []struct {
		e   *espd
		spi uint32
		dst netip.Addr
	}{{a, spiAB, b4}, {a, spiBA, a4}, {b, spiAB, b4}, {b, spiBA, a4}} {
		if n := c.e.saCounter(t, c.spi, c.dst, cntPackets...); n == 0 {
			t.Errorf("espctl on %s: state 0x%x counted no packets", c.e.node.Role, c.spi)
		}
	}
	for _, e := range []*espd{a, b} {
		log := strings.ToLower(e.proc.Log())
		for _, k := range [][]byte{keyAB, keyBA} {
			if strings.Contains(log, hex.EncodeToString(k)) {
				t.Errorf("espd on %s logged a key", e.node.Role)
			}
		}
		if e.logContains("built without GOEXPERIMENT=runtimesecret") {
			t.Errorf("espd on %s says it was built without GOEXPERIMENT=runtimesecret", e.node.Role)
		}
		e.alive(t)
	}
}
