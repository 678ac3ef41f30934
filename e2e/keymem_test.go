package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// requireSecretErasure fails unless the espd under test was built with
// GOEXPERIMENT=runtimesecret (testbed.GoBuild adds it to every build, so
// this guards the build, not the caller's environment): without it key
// schedules would stay in freed memory, as docs/safety.md says.
func requireSecretErasure(t *testing.T) {
	t.Helper()
	ok, err := testbed.BuiltWithSecretErasure(espdBin)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Fatalf("%s is built without GOEXPERIMENT=%s", espdBin, testbed.SecretExperiment)
	}
}

// keyNeedles returns what of one state's keys must not be in espd's memory
// once the state is gone: the cipher key (without the salt: four bytes
// say nothing, and the AES and ChaCha20 key schedules begin with the key
// itself), the integrity key, the HMAC pads (the key XORed with 0x36 and
// 0x5c, from which it is read back at once) and the keys as hex text (a
// configuration file's inline keys).
func keyNeedles(name, suite string, enc, integ []byte) map[string][]byte {
	n := map[string][]byte{}
	cipherKey := enc
	if integ == nil { // the AEADs: the salt is the last four bytes
		cipherKey = enc[:len(enc)-4]
	}
	n[name+" cipher key"] = cipherKey
	n[name+" cipher key hex"] = []byte(hex.EncodeToString(enc))
	if integ != nil {
		n[name+" integrity key"] = integ
		n[name+" integrity key hex"] = []byte(hex.EncodeToString(integ))
		for _, pad := range []byte{0x36, 0x5c} {
			x := make([]byte, len(integ))
			for i := range integ {
				x[i] = integ[i] ^ pad
			}
			n[fmt.Sprintf("%s integrity key ^ 0x%02x", name, pad)] = x
		}
	}
	return n
}

// rawNeedles are the needles that must be found while the states are in
// use: the keys themselves, which the key schedules hold.
func rawNeedles(needles map[string][]byte) map[string][]byte {
	raw := map[string][]byte{}
	for name, n := range needles {
		if strings.HasSuffix(name, " key") {
			raw[name] = n
		}
	}
	return raw
}

// scan returns what of needles is in e's memory.
func (e *espd) scan(t *testing.T, needles map[string][]byte) []testbed.MemoryHit {
	t.Helper()
	hits, err := testbed.ScanMemory(e.proc.Pid(), needles)
	if err != nil {
		t.Fatalf("reading espd's memory: %v", err)
	}
	return hits
}

// expectInMemory checks that every needle is found: the scan sees the keys
// while they are in use, so an empty scan afterwards means something.
func expectInMemory(t *testing.T, e *espd, needles map[string][]byte) {
	t.Helper()
	found := map[string]bool{}
	for _, h := range e.scan(t, needles) {
		found[h.Needle] = true
	}
	for name := range needles {
		if !found[name] {
			t.Errorf("%s is not in espd's memory while its state is installed: the scan cannot see keys", name)
		}
	}
}

// expectErased waits (up to five seconds: the erasing collection runs
// within 100 ms of a deletion) until no needle is in e's memory, and
// reports every place one still is.
func expectErased(t *testing.T, e *espd, needles map[string][]byte, after string) {
	t.Helper()
	var hits []testbed.MemoryHit
	if eventually(5*time.Second, func() bool {
		hits = e.scan(t, needles)
		return len(hits) == 0
	}) {
		return
	}
	for _, h := range hits {
		t.Errorf("after %s: %v", after, h)
	}
}

// TestKeyMem runs traffic both ways through a tunnel, deletes gwA's two
// states with espctl and reads espd's memory: the keys, their HMAC pads
// and hex forms are nowhere, not in the control socket's buffers, the
// database, the transforms and their pools, the key schedules, nor the
// stacks of the workers that ran the ciphers. While the states are
// installed the same scan finds the keys, so it can see them.
func TestKeyMem(t *testing.T) {
	requireSecretErasure(t)
	for _, suite := range []string{"aes128gcm16", "chacha20poly1305", "aes128-sha256"} {
		t.Run(suite, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			tn := newTunnel(t, tunnelOpts{suite: suite, inner: []testbed.Family{testbed.IPv4}})
			ping(t, ctx, tn.top, testbed.IPv4, false)
			ping(t, ctx, tn.top, testbed.IPv4, true)
			needles := map[string][]byte{}
			for _, s := range tn.aSAs {
				for k, v := range keyNeedles(fmt.Sprintf("%s 0x%x", s.dir, s.spi), suite, s.encKey, s.integKey) {
					needles[k] = v
				}
			}
			expectInMemory(t, tn.a, rawNeedles(needles))
			for _, s := range tn.aSAs {
				tn.a.mustCtl(t, saGetArgs("del", s.spi, s.dst)...)
			}
			expectErased(t, tn.a, needles, "sa del")
			tn.a.alive(t)
		})
	}
}

// TestKeyMemConfig keys gwA from a configuration file with inline keys,
// runs traffic, then reloads a file with other keys: the old keys, which
// passed through the file's text and the TOML decoder, are gone from
// espd's memory.
func TestKeyMemConfig(t *testing.T) {
	requireSecretErasure(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const suite = "aes256gcm16"
	top := newTopology(t, 0)
	a4, b4 := testbed.GwATransitV4.Addr(), testbed.GwBTransitV4.Addr()
	lanA, lanB := testbed.LANAV4, testbed.LANBV4
	files := func(ab, ba uint32, keyAB, keyBA []byte) (string, string) {
		fa := gatewayFile([]fileSA{
			{spi: ab, dir: "out", src: a4, dst: b4, suite: suite, key: keyAB},
			{spi: ba, dir: "in", src: b4, dst: a4, suite: suite, key: keyBA},
		}, []netip.Prefix{lanA}, []netip.Prefix{lanB})
		fb := gatewayFile([]fileSA{
			{spi: ba, dir: "out", src: b4, dst: a4, suite: suite, key: keyBA},
			{spi: ab, dir: "in", src: a4, dst: b4, suite: suite, key: keyAB},
		}, []netip.Prefix{lanB}, []netip.Prefix{lanA})
		return fa, fb
	}
	dir := t.TempDir()
	pathA, pathB := filepath.Join(dir, "gwa.toml"), filepath.Join(dir, "gwb.toml")
	keyAB, keyBA := randKey(t, 36), randKey(t, 36)
	fa, fb := files(spiAB, spiBA, keyAB, keyBA)
	writeSecret(t, pathA, fa)
	writeSecret(t, pathB, fb)
	a := startEspd(t, top.GwA, "--config", pathA)
	startEspd(t, top.GwB, "--config", pathB)
	ping(t, ctx, top, testbed.IPv4, false)

	needles := keyNeedles("out", suite, keyAB, nil)
	for k, v := range keyNeedles("in", suite, keyBA, nil) {
		needles[k] = v
	}
	expectInMemory(t, a, rawNeedles(needles))

	// The file text the test wrote is in this process, not espd's; the
	// new file keys gwA with other SPIs and keys.
	const newAB, newBA uint32 = 0x1002, 0x2002
	fa, _ = files(newAB, newBA, randKey(t, 36), randKey(t, 36))
	writeSecret(t, pathA, fa)
	if err := a.proc.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if !eventually(10*time.Second, func() bool { return sameSPIs(a.spis(t), []uint32{newAB, newBA}) }) {
		t.Fatalf("gwA after SIGHUP: states %v, want 0x%x and 0x%x", keys(a.spis(t)), newAB, newBA)
	}
	expectErased(t, a, needles, "a reload that removed the states")
	a.alive(t)
}
