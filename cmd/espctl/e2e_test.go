package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/espd/espd/control"
	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/packet"
	"github.com/espd/espd/sa"
)

// dbBackend serves a real sa.DB.
type dbBackend struct{ db *sa.DB }

func (b dbBackend) AddSA(c sa.Config) error {
	if _, ok := b.db.GetSA(c.SPI, c.Dst); ok {
		return wire.Errorf(wire.EEXIST, "state spi 0x%08x dst %v already exists", c.SPI, c.Dst)
	}
	_, err := b.db.AddSA(c)
	return err
}
func (b dbBackend) UpdateSA(c sa.Config) error                { return b.db.UpdateSA(c) }
func (b dbBackend) DeleteSA(spi uint32, dst netip.Addr) error { return b.db.DeleteSA(spi, dst) }
func (b dbBackend) GetSA(spi uint32, dst netip.Addr) (wire.SAInfo, error) {
	s, ok := b.db.GetSA(spi, dst)
	if !ok {
		return wire.SAInfo{}, fmt.Errorf("state spi 0x%08x dst %v: %w", spi, dst, sa.ErrNotFound)
	}
	return wire.InfoOf(s), nil
}
func (b dbBackend) ListSAs() ([]wire.SAInfo, error) {
	var out []wire.SAInfo
	for _, s := range b.db.SAs() {
		out = append(out, wire.InfoOf(s))
	}
	return out, nil
}
func (b dbBackend) FlushSAs() error                             { b.db.FlushSAs(); return nil }
func (b dbBackend) AddPolicy(p sa.Policy) (sa.Policy, error)    { return b.db.AddPolicy(p) }
func (b dbBackend) UpdatePolicy(p sa.Policy) (sa.Policy, error) { return b.db.UpdatePolicy(p) }
func (b dbBackend) DeletePolicy(id sa.PolicyID) error           { return b.db.DeletePolicy(id) }
func (b dbBackend) GetPolicy(id sa.PolicyID) (sa.Policy, error) {
	p, ok := b.db.GetPolicy(id)
	if !ok {
		return sa.Policy{}, fmt.Errorf("policy: %w", sa.ErrNotFound)
	}
	return p, nil
}
func (b dbBackend) ListPolicies() ([]sa.Policy, error)     { return b.db.Policies(), nil }
func (b dbBackend) FlushPolicies() error                   { b.db.FlushPolicies(); return nil }
func (b dbBackend) AllocSPI(lo, hi uint32) (uint32, error) { return b.db.AllocSPI(lo, hi) }
func (b dbBackend) Stats() (wire.GlobalStats, error) {
	return wire.GlobalStats{GlobalStats: b.db.Stats()}, nil
}
func (b dbBackend) Subscribe(n int) (control.Subscription, error) {
	return control.SubscribeDB(b.db, n), nil
}

// PairRole answers as an espd that is not one of a gateway pair.
func (b dbBackend) PairRole(wire.PairRole) (wire.PairStatus, error) {
	return wire.PairStatus{}, wire.Errorf(wire.EOPNOTSUPP, "espd runs without --pair-node: it is not one of a gateway pair")
}

// daemon is an in-process control server over a fresh sa.DB.
type daemon struct {
	db   *sa.DB
	sock string
}

func startDaemon(t *testing.T) *daemon {
	t.Helper()
	return startDaemonWith(t, func(db *sa.DB) control.Backend { return dbBackend{db} })
}

// startDaemonWith is startDaemon serving the Backend that backend makes
// of the fresh sa.DB.
func startDaemonWith(t *testing.T, backend func(*sa.DB) control.Backend) *daemon {
	t.Helper()
	db := sa.NewDB(sa.Options{AcquireInterval: -1})
	sock := filepath.Join(t.TempDir(), "espd.sock")
	s, err := control.Listen(backend(db), control.ServerConfig{Path: sock})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() {
		s.Close()
		<-done
	})
	return &daemon{db: db, sock: sock}
}

// espctl runs a command line and returns stdout; a non-zero exit fails
// the test unless wantCode says otherwise.
func (d *daemon) espctl(t *testing.T, wantCode int, args ...string) (string, string) {
	t.Helper()
	return d.espctlIn(t, wantCode, "", args...)
}

// espctlIn is espctl with this standard input.
func (d *daemon) espctlIn(t *testing.T, wantCode int, stdin string, args ...string) (string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	code := run(ctx, append([]string{"-s", d.sock}, args...), strings.NewReader(stdin), &out, &errb)
	if code != wantCode {
		t.Fatalf("espctl %q: exit %d, want %d; stderr: %s", args, code, wantCode, errb.String())
	}
	return out.String(), errb.String()
}

func TestEndToEnd(t *testing.T) {
	d := startDaemon(t)

	spiOut, _ := d.espctl(t, 0, "spi", "alloc", "--min", "0x1000", "--max", "0x1fff")
	spi := strings.TrimSpace(spiOut)
	if !strings.HasPrefix(spi, "0x00001") {
		t.Fatalf("spi alloc: %q", spiOut)
	}
	d.espctlIn(t, 0, strings.Repeat("ab", 36)+"\n", "sa", "add", "--spi", spi, "--src", "2001:db8::1", "--dst", "2001:db8::2", "--dir", "in",
		"--enc", "chacha20poly1305", "--enc-key-file", "-", "--replay-window", "256", "--reqid", "3",
		"--sel", "src=2001:db8:1::/48,dst=2001:db8:2::/48")
	d.espctlIn(t, 0, strings.Repeat("01", 16)+"\n0x"+strings.Repeat("02", 20)+"\n", "sa", "add", "--spi", "0xc0000001", "--src", "198.18.0.1", "--dst", "198.18.0.2", "--dir", "out",
		"--enc", "aes128", "--auth", "sha1", "--enc-key-file", "-", "--integ-key-file", "-",
		"--reqid", "3", "--encap-sport", "4500", "--encap-dport", "4500", "--soft-packets", "100", "--hard-packets", "200", "--dscp", "copy")
	_, stderr := d.espctl(t, 1, "sa", "add", "--spi", "0xc0000001", "--src", "198.18.0.1", "--dst", "198.18.0.2", "--dir", "out",
		"--enc", "aes128gcm16", "--enc-key-file", keyFile(t, gcmKey))
	if !strings.Contains(stderr, "espctl: sa add: state spi 0xc0000001 dst 198.18.0.2 already exists (EEXIST)") {
		t.Fatalf("duplicate: %q", stderr)
	}

	out, _ := d.espctl(t, 0, "sa", "get", "--spi", "0xc0000001", "--dst", "198.18.0.2")
	for _, want := range []string{"spi 0xc0000001 dir out state valid reqid 3", "encap udp 4500 -> 4500",
		"alg aes128-sha1 (ENCR_AES_CBC 128, AUTH_HMAC_SHA1_96) keys [redacted]", "dscp copy", "lifetime soft: 100 packets"} {
		if !strings.Contains(out, want) {
			t.Errorf("sa get: missing %q in\n%s", want, out)
		}
	}
	if strings.Contains(out, strings.Repeat("01", 16)) || strings.Contains(out, strings.Repeat("02", 20)) {
		t.Fatal("sa get shows key material")
	}

	// Traffic on the outbound state shows up in the counters.
	s, _ := d.db.GetSA(0xc0000001, netip.MustParseAddr("198.18.0.2"))
	s.Account(7, 700)

	out, _ = d.espctl(t, 0, "--json", "sa", "list")
	var list []map[string]any
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("sa list --json: %v\n%s", err, out)
	}
	if len(list) != 2 || list[0]["alg"] != "chacha20poly1305" || list[0]["replay_window"] != float64(256) ||
		list[1]["stats"].(map[string]any)["packets"] != float64(7) || list[1]["keys"] != "[redacted]" {
		t.Fatalf("sa list --json: %s", out)
	}
	out, _ = d.espctl(t, 0, "sa", "list")
	if strings.Count(out, "spi 0x") != 2 {
		t.Fatalf("sa list:\n%s", out)
	}

	// MOBIKE-style move, and a soft limit change that keeps the rest.
	d.espctl(t, 0, "sa", "update", "--spi", "0xc0000001", "--dst", "198.18.0.2", "--new-dst", "198.18.0.3", "--soft-packets", "150")
	out, _ = d.espctl(t, 0, "sa", "get", "--json", "--spi", "0xc0000001", "--dst", "198.18.0.3")
	var got map[string]any
	json.Unmarshal([]byte(out), &got)
	if got["dst"] != "198.18.0.3" || got["soft"].(map[string]any)["packets"] != float64(150) ||
		got["hard"].(map[string]any)["packets"] != float64(200) || got["copy_dscp"] != true {
		t.Fatalf("after update: %s", out)
	}
	_, stderr = d.espctl(t, 1, "sa", "update", "--spi", "0xc0000001", "--dst", "198.18.0.3", "--reqid", "9")
	if !strings.Contains(stderr, "cannot change the reqid") {
		t.Fatalf("reqid change: %q", stderr)
	}

	out, _ = d.espctl(t, 0, "stats")
	if !strings.Contains(out, "states 2 (larval 0), policies 0") || !strings.Contains(out, "traffic: 7 packets, 700 bytes") {
		t.Fatalf("stats:\n%s", out)
	}
	out, _ = d.espctl(t, 0, "--json", "stats", "--spi", "0xc0000001", "--dst", "198.18.0.3")
	var st map[string]any
	if err := json.Unmarshal([]byte(out), &st); err != nil || len(st["sas"].([]any)) != 1 {
		t.Fatalf("stats --json one: %v %s", err, out)
	}

	// Policies.
	out, _ = d.espctl(t, 0, "policy", "add", "--dst", "198.19.0.0/16", "--dir", "out", "--reqid", "3",
		"--tmpl-src", "198.18.0.1", "--tmpl-dst", "198.18.0.3", "--priority", "100")
	if !strings.Contains(out, "src any dst 198.19.0.0/16\n\tdir out action protect priority 100 index ") {
		t.Fatalf("policy add:\n%s", out)
	}
	d.espctl(t, 0, "policy", "add", "--src", "198.18.5.0/24", "--proto", "tcp", "--dport", "22", "--dir", "in", "--action", "bypass")
	d.espctl(t, 0, "policy", "update", "--dst", "198.19.0.0/16", "--dir", "out", "--reqid", "3", "--priority", "50")
	out, _ = d.espctl(t, 0, "--json", "policy", "get", "--dst", "198.19.0.0/16", "--dir", "out")
	var pol map[string]any
	json.Unmarshal([]byte(out), &pol)
	if pol["priority"] != float64(50) || pol["action"] != "protect" {
		t.Fatalf("policy get: %s", out)
	}
	out, _ = d.espctl(t, 0, "policy", "list")
	if strings.Count(out, "\tdir ") != 2 || !strings.Contains(out, "src 198.18.5.0/24 dst any proto tcp dport 22") {
		t.Fatalf("policy list:\n%s", out)
	}
	d.espctl(t, 0, "policy", "del", "--src", "198.18.5.0/24", "--proto", "tcp", "--dport", "22", "--dir", "in")
	_, stderr = d.espctl(t, 1, "policy", "get", "--src", "198.18.5.0/24", "--proto", "tcp", "--dport", "22", "--dir", "in")
	if !strings.Contains(stderr, "(ENOENT)") {
		t.Fatalf("deleted policy: %q", stderr)
	}

	// monitor: an acquire, then the hard expiry of the outbound state.
	mon := &syncWriter{lines: make(chan string, 16)}
	monDone := make(chan int, 1)
	var monErr bytes.Buffer
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		monDone <- run(ctx, []string{"-s", d.sock, "--json", "monitor", "--count", "2", "--events", "acquire,hard-expire"}, nil, mon, &monErr)
	}()
	p, ok := d.db.GetPolicy(sa.PolicyID{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.0.0/16")}, Dir: sa.DirOut})
	if !ok {
		t.Fatal("policy gone")
	}
	var lines []string
	// The monitor subscribes in the background: fire acquires until one
	// reaches it (those fired before it subscribed reach no one).
	for i := 0; len(lines) == 0; i++ {
		if i == 20 {
			t.Fatal("monitor got no acquire")
		}
		d.db.Acquire(p, packet.Flow{Src: netip.MustParseAddr("198.18.9.9"), Dst: netip.MustParseAddr("198.19.0.5"), Proto: 17, SrcPort: 5, DstPort: 53})
		select {
		case l := <-mon.lines:
			lines = append(lines, l)
		case <-time.After(time.Second):
		}
	}
	s, _ = d.db.GetSA(0xc0000001, netip.MustParseAddr("198.18.0.3"))
	s.Account(200, 2000)
	select {
	case code := <-monDone:
		if code != 0 {
			t.Fatalf("monitor exit %d: %s", code, monErr.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("monitor did not finish")
	}
	close(mon.lines)
	for l := range mon.lines {
		lines = append(lines, l)
	}
	if len(lines) != 2 {
		t.Fatalf("monitor printed %q", lines)
	}
	var acq, hard map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &acq); err != nil || acq["type"] != "acquire" || acq["reqid"] != float64(3) ||
		acq["flow"].(map[string]any)["dst"] != "198.19.0.5" {
		t.Fatalf("acquire line %q: %v", lines[0], err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &hard); err != nil || hard["type"] != "hard-expire" ||
		hard["spi"] != float64(0xc0000001) || hard["reason"] != "packet limit" {
		t.Fatalf("hard-expire line %q: %v", lines[1], err)
	}

	d.espctl(t, 0, "sa", "del", "--spi", spi, "--dst", "2001:db8::2")
	_, stderr = d.espctl(t, 1, "sa", "get", "--spi", spi, "--dst", "2001:db8::2")
	if !strings.Contains(stderr, "not found (ENOENT)") {
		t.Fatalf("deleted state: %q", stderr)
	}
	d.espctl(t, 0, "sa", "flush")
	d.espctl(t, 0, "policy", "flush")
	out, _ = d.espctl(t, 0, "--json", "sa", "list")
	if strings.TrimSpace(out) != "[]" {
		t.Fatalf("after flush: %s", out)
	}
	out, _ = d.espctl(t, 0, "policy", "list")
	if out != "" {
		t.Fatalf("policies after flush: %q", out)
	}
}

// syncWriter hands each line written to it to a channel.
type syncWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	lines chan string
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		l, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(l)
			return len(p), nil
		}
		w.lines <- strings.TrimSuffix(l, "\n")
	}
}
