package daemon

import (
	"bytes"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/sa"
)

// lockedBuffer is a bytes.Buffer that a daemon's goroutines may log to.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestSlowAESWarning: on a CPU without AES instructions (simulated), a
// state of an AES suite logs one warning per suite, whether the
// configuration file or the control socket installs it, a ChaCha20 state
// none; espd_cpu_aes is 0 (metrics' TestCPUAES: 1 where the CPU has them).
func TestSlowAESWarning(t *testing.T) {
	accelerated := aesAccelerated
	aesAccelerated = func() bool { return false }
	t.Cleanup(func() { aesAccelerated = accelerated }) // after the daemon's own clean-up

	cfg := filepath.Join(t.TempDir(), "espd.toml")
	file := saTOML("0x100", "out", key20) + saTOML("0x101", "in", key20b)
	if err := os.WriteFile(cfg, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	d, client, _ := startMetricsDaemon(t, Options{
		Dataplane: dataplane.Config{Keepalive: -1}, ConfigPath: cfg,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	for i, name := range []string{"aes256-sha256", "aes256-sha256-esn", "chacha20poly1305", "aes128gcm16"} {
		suite, err := crypto.ParseSuite(name)
		if err != nil {
			t.Fatal(err)
		}
		c := sa.Config{SPI: uint32(0x200 + i), Suite: suite, ReqID: 2, Dir: sa.DirOut,
			Src: netip.MustParseAddr("198.18.0.1"), Dst: netip.MustParseAddr("198.18.0.2")}
		c.EncKey = bytes.Repeat([]byte{byte(i + 1)}, suite.EncKeyLen())
		c.IntegKey = bytes.Repeat([]byte{byte(i + 1)}, suite.IntegKeyLen())
		if err := d.AddSA(c); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	warnings := map[string]int{}
	for _, l := range strings.Split(logs.String(), "\n") {
		if _, suite, ok := strings.Cut(l, " suite="); ok && strings.Contains(l, "no AES instructions") {
			warnings[suite]++
		}
	}
	if want := map[string]int{"aes128gcm16": 1, "aes256-sha256": 1}; !maps.Equal(warnings, want) {
		t.Errorf("warnings by suite %v, want %v\n%s", warnings, want, logs.String())
	}
	if body := get(t, client); !strings.Contains(body, "\nespd_cpu_aes 0\n") {
		t.Errorf("no espd_cpu_aes 0 in the metrics")
	}
}
