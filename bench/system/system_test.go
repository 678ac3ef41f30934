package system

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/bench/load"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/testbed"
	"golang.org/x/crypto/curve25519"
)

func TestTestKey(t *testing.T) {
	a, b := TestKey("x", 70), TestKey("x", 70)
	if len(a) != 70 || !bytes.Equal(a, b) {
		t.Fatalf("TestKey not deterministic or wrong length: %d", len(a))
	}
	if bytes.Equal(TestKey("y", 70), a) || !bytes.Equal(TestKey("x", 20), a[:20]) {
		t.Error("TestKey: labels do not separate keys, or lengths change the prefix")
	}
	s, _ := crypto.ParseSuite("aes128-sha256")
	enc, integ := SuiteKeys(s, SPIAB)
	if len(enc) != 16 || len(integ) != 32 {
		t.Errorf("SuiteKeys lengths %d+%d", len(enc), len(integ))
	}
	if e2, _ := SuiteKeys(s, SPIBA); bytes.Equal(e2, enc) {
		t.Error("both directions got the same key")
	}
	g, _ := crypto.ParseSuite("aes128gcm16")
	if eg, _ := SuiteKeys(g, SPIAB); bytes.Equal(eg[:16], enc) {
		t.Error("two suites got the same key")
	}
	priv, pub, err := wgKey("gwA")
	if err != nil {
		t.Fatal(err)
	}
	if priv[0]&7 != 0 || priv[31]&0x80 != 0 || priv[31]&0x40 == 0 {
		t.Errorf("private key not clamped: %x", priv)
	}
	if want, _ := curve25519.X25519(priv, curve25519.Basepoint); !bytes.Equal(pub, want) {
		t.Error("public key does not match the private key")
	}
}

func TestSkipError(t *testing.T) {
	e := &SkipError{Reason: "wireguard-go not installed", Enable: "go install golang.zx2c4.com/wireguard@latest"}
	if e.Error() != "wireguard-go not installed (enable with: go install golang.zx2c4.com/wireguard@latest)" {
		t.Errorf("SkipError: %q", e.Error())
	}
	if !IsUnavailable(errors.Join(errors.New("x"), &UnavailableError{Reason: "no ESP"})) || IsUnavailable(e) {
		t.Error("IsUnavailable")
	}
}

// TestSystems sets up every system that can run here, keys it for
// aes128gcm16, pings the server from the client through it (a
// host-to-host system's other host from the first: EndpointsOf) and
// checks the tunnel's counters where it has them; systems that cannot run
// are skipped with their reason, XFRM must then say why.
func TestSystems(t *testing.T) {
	if err := testbed.Available(); err != nil {
		t.Skip(err)
	}
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("needs the go command to build espd")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin", "espd")
	if err := testbed.GoBuild(bin, testbed.EspdPackage); err != nil {
		t.Fatal(err)
	}
	env := &Env{Dir: dir, Family: testbed.IPv4, Prefix: "ebsys", EspdBin: bin, WireGuardBin: FindWireGuard(), Logf: t.Logf}
	suite, _ := crypto.ParseSuite("aes128gcm16")
	for _, s := range All() {
		t.Run(s.Name(), func(t *testing.T) {
			if err := s.Available(env); err != nil {
				t.Skip(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				// Only this process's: names carry the pid, and another
				// test binary may be running the same test.
				if ns, _ := filepath.Glob(filepath.Join(testbed.NetnsDir, fmt.Sprintf("ebsys-*-%d-*", os.Getpid()))); len(ns) > 0 {
					t.Errorf("namespaces left: %v", ns)
				}
			})
			if err := s.Setup(ctx, env); err != nil {
				t.Fatal(err)
			}
			err := s.Key(ctx, suite)
			if IsUnavailable(err) {
				if !strings.HasPrefix(s.Name(), "xfrm") {
					t.Fatalf("%s unavailable: %v", s.Name(), err)
				}
				t.Skipf("unavailable here: %v", err)
			}
			if err != nil {
				t.Fatal(err)
			}
			before, has, err := s.Counters(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ep := EndpointsOf(s, testbed.IPv4)
			if _, err := load.Ping(ctx, ep.From, ep.Dst, 3); err != nil {
				t.Fatal(err)
			}
			a, b := s.Gateways()
			for _, pid := range append(a, b...) {
				if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err != nil {
					t.Errorf("gateway process %d: %v", pid, err)
				}
			}
			if has {
				after, _, err := s.Counters(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if after.OutPackets-before.OutPackets < 3 || after.InPackets-before.InPackets < 3 {
					t.Errorf("counters after 3 pings: %+v -> %+v", before, after)
				}
			}
			if err := s.Unkey(ctx); err != nil {
				t.Error(err)
			}
		})
	}
}
