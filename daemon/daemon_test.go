package daemon

import (
	"bytes"
	"context"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/control"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/sa"
	"github.com/espd/espd/testbed"
)

// running is a Daemon started inside a namespace of its own.
type running struct {
	d      *Daemon
	ns     *testbed.Node
	sock   string
	cfg    string
	reload chan struct{}
	run    *daemonRun
}

// start runs a daemon in a fresh namespace with the given configuration
// file contents ("" for none) and stops it when the test ends.
func start(t *testing.T, config string) *running {
	t.Helper()
	ns := testbed.NewNodeT(t, "daemon")
	dir := t.TempDir()
	r := &running{ns: ns, sock: filepath.Join(dir, "espd.sock"), reload: make(chan struct{})}
	opts := Options{
		Dataplane: dataplane.Config{Keepalive: -1},
		Control:   control.ServerConfig{Path: r.sock},
	}
	if config != "" {
		r.cfg = filepath.Join(dir, "espd.toml")
		if err := os.WriteFile(r.cfg, []byte(config), 0o600); err != nil {
			t.Fatal(err)
		}
		opts.ConfigPath = r.cfg
	}
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	r.d = d
	t.Cleanup(func() { // runs after runIn's, which stops the daemon
		if _, err := ns.IP(context.Background(), "link", "show", "esp0"); err == nil {
			t.Error("the TUN device outlived the daemon")
		}
	})
	r.run = runIn(t, ns, d, r.reload)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(r.sock); err == nil {
			return r
		}
		if gone, err := r.run.exited(); gone {
			t.Fatalf("daemon exited at start: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatal("control socket did not appear within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

const key20 = "0x000102030405060708090a0b0c0d0e0f10111213"
const key20b = "0x100102030405060708090a0b0c0d0e0f10111213"

func saTOML(spi, dir, key string) string {
	return "[[sa]]\nspi = " + spi + "\ndir = \"" + dir + "\"\nsrc = \"198.18.0.1\"\ndst = \"198.18.0.2\"\nsuite = \"aes128gcm16\"\nenc_key = \"" + key + "\"\nreqid = 1\n"
}

func policyTOML(dst string) string {
	return "[[policy]]\nsrc = \"198.18.1.0/24\"\ndst = \"" + dst + "\"\ndir = \"out\"\nreqid = 1\n"
}

// routes lists the destinations routed into the TUN.
func (r *running) routes(t *testing.T) string {
	return r.ns.MustIP(t, "route", "show", "table", "all", "dev", "esp0")
}

func (r *running) reloadWith(t *testing.T, config string) {
	t.Helper()
	if err := os.WriteFile(r.cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.d.Reload(); err != nil {
		t.Fatal(err)
	}
}

// hup writes the file and delivers SIGHUP's reload to Run, then waits
// (bounded) until done reports the reload took effect. Run reloads on its
// own goroutine, so the test must not touch the file again before then.
func (r *running) hup(t *testing.T, config string, done func() bool) {
	t.Helper()
	if err := os.WriteFile(r.cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	r.reload <- struct{}{}
	deadline := time.Now().Add(10 * time.Second)
	for !done() {
		if time.Now().After(deadline) {
			t.Fatal("the reload on SIGHUP did not take effect within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Reload holds d.mu until it is done: wait for the last of it.
	r.d.mu.Lock()
	//lint:ignore SA2001 the empty section is the wait: Reload holds d.mu until it is done
	r.d.mu.Unlock()
}

func TestReloadAppliesDifference(t *testing.T) {
	r := start(t, saTOML("0x1001", "out", key20)+policyTOML("198.18.2.0/24")+policyTOML("198.18.3.0/24"))
	db := r.d.DB()
	dst := netip.MustParseAddr("198.18.0.2")
	s1, ok := db.GetSA(0x1001, dst)
	if !ok || len(db.Policies()) != 2 {
		t.Fatalf("config not loaded: sa %v, %d policies", ok, len(db.Policies()))
	}
	if rt := r.routes(t); !strings.Contains(rt, "198.18.2.0/24") || !strings.Contains(rt, "198.18.3.0/24") {
		t.Fatalf("policy routes missing:\n%s", rt)
	}

	// A state added through the control socket is not the file's.
	c, err := control.Dial(context.Background(), r.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	suite, _ := crypto.ParseSuite("aes128gcm16")
	ctlSA := sa.Config{SPI: 0x3001, Dir: sa.DirIn, Src: dst, Dst: netip.MustParseAddr("198.18.0.1"), Suite: suite,
		EncKey: bytes.Repeat([]byte{0x5a}, 20), ReplayWindow: 32, ReqID: 1}
	if err := c.AddSA(context.Background(), ctlSA); err != nil {
		t.Fatal(err)
	}

	// Same SA with a new key (replaced), one policy gone, a second SA;
	// delivered as SIGHUP is.
	r.hup(t, saTOML("0x1001", "out", key20b)+saTOML("0x1002", "out", key20)+policyTOML("198.18.2.0/24"), func() bool {
		_, added := db.GetSA(0x1002, dst)
		return added && len(db.Policies()) == 1
	})
	s1b, ok := db.GetSA(0x1001, dst)
	if !ok || s1b == s1 {
		t.Errorf("SA 0x1001 with a new key was not replaced (found %v, same %v)", ok, s1b == s1)
	}
	if s1.Alive() {
		t.Error("the replaced SA is still alive")
	}
	if _, ok := db.GetSA(0x1002, dst); !ok {
		t.Error("new SA 0x1002 not added")
	}
	if n := len(db.Policies()); n != 1 {
		t.Errorf("%d policies after reload, want 1", n)
	}
	if rt := r.routes(t); strings.Contains(rt, "198.18.3.0/24") || !strings.Contains(rt, "198.18.2.0/24") {
		t.Errorf("routes after reload:\n%s", rt)
	}
	if _, ok := db.GetSA(0x3001, netip.MustParseAddr("198.18.0.1")); !ok {
		t.Error("reload removed an SA installed through the control socket")
	}

	// An unchanged reload keeps the very same states (no sequence reset).
	s2 := func() *sa.SA { s, _ := db.GetSA(0x1002, dst); return s }()
	r.reloadWith(t, saTOML("0x1001", "out", key20b)+saTOML("0x1002", "out", key20)+policyTOML("198.18.2.0/24"))
	if s, _ := db.GetSA(0x1002, dst); s != s2 {
		t.Error("an unchanged SA was replaced by a reload")
	}

	// An invalid file, and a file that collides with the control socket's
	// SA, are refused and change nothing.
	before := len(db.SAs())
	for _, bad := range []string{
		saTOML("0x1001", "out", key20b) + "bogus = 1\n",
		saTOML("0x1001", "out", key20b) + strings.Replace(saTOML("0x3001", "in", key20), "198.18.0.2\"\nsuite", "198.18.0.1\"\nsuite", 1),
	} {
		if err := os.WriteFile(r.cfg, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := r.d.Reload(); err == nil {
			t.Errorf("reload of a bad file succeeded:\n%s", bad)
		}
	}
	if len(db.SAs()) != before || len(db.Policies()) != 1 {
		t.Errorf("a refused reload changed the state: %d SAs (want %d), %d policies", len(db.SAs()), before, len(db.Policies()))
	}
	if _, ok := db.GetSA(0x1002, dst); !ok {
		t.Error("a refused reload removed SA 0x1002")
	}
}

func TestMetricsAndShutdown(t *testing.T) {
	r := start(t, saTOML("0x1001", "out", key20)+policyTOML("198.18.2.0/24"))
	rec := httptest.NewRecorder()
	r.d.metricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{
		"espd_packets_total 0", `espd_drops_total{reason="integrity"} 0`,
		"espd_states 1", "espd_policies 1", "espd_dataplane_invalid_spi_total 0", "espd_dataplane_tun_rx_packets_total",
		"espd_dataplane_queue_drops_total",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(body, "0102030405") {
		t.Error("metrics contain key material")
	}
	if strings.Contains(body, "espd_sa_") {
		t.Error("per-state series without --metrics-per-sa (package metrics' TestMetricsScale tests them)")
	}
}
