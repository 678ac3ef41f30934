package daemon

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/control"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/sa"
	"github.com/espd/espd/testbed"
)

// startWith is start with a state directory (espd --state-dir).
func startWith(t *testing.T, config, stateDir string) *running {
	t.Helper()
	ns := testbed.NewNodeT(t, "reload")
	dir := t.TempDir()
	r := &running{ns: ns, sock: filepath.Join(dir, "espd.sock"), reload: make(chan struct{})}
	r.cfg = filepath.Join(dir, "espd.toml")
	if err := os.WriteFile(r.cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := New(Options{
		Dataplane:  dataplane.Config{Keepalive: -1},
		Control:    control.ServerConfig{Path: r.sock},
		ConfigPath: r.cfg,
		StateDir:   stateDir,
	})
	if err != nil {
		t.Fatal(err)
	}
	r.d = d
	r.run = runIn(t, ns, d, r.reload)
	if !pollFor(10*time.Second, func() bool { _, err := os.Stat(r.sock); return err == nil }) {
		if gone, err := r.run.exited(); gone {
			t.Fatalf("daemon exited at start: %v", err)
		}
		t.Fatal("control socket did not appear within 10 s")
	}
	return r
}

func pollFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// reloadSA is an [[sa]] table; extra is appended inside it.
func reloadSA(spi, dir, src, dst, suite, key string, reqid int, extra string) string {
	return fmt.Sprintf("[[sa]]\nspi = %s\ndir = %q\nsrc = %q\ndst = %q\nsuite = %q\nenc_key = %q\nreqid = %d\n%s", spi, dir, src, dst, suite, key, reqid, extra)
}

func reloadPolicy(dst string, reqid int) string {
	return fmt.Sprintf("[[policy]]\nsrc = \"198.18.1.0/24\"\ndst = %q\ndir = \"out\"\nreqid = %d\n", dst, reqid)
}

const (
	keyOut  = "0x200102030405060708090a0b0c0d0e0f10111213"
	keyIn   = "0x300102030405060708090a0b0c0d0e0f10111213"
	keyCtl  = "0x400102030405060708090a0b0c0d0e0f10111213"
	keyNew  = "0x500102030405060708090a0b0c0d0e0f10111213"
	gwLocal = "198.18.0.1"
	gwPeer  = "198.18.0.2"
)

// snapshot is everything a reload may change: states (identity,
// configuration, sequence numbers, replay top), policies with their
// indexes, every route and rule in the namespace, and the file's
// bookkeeping.
func (r *running) snapshot(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, s := range r.d.DB().SAs() {
		fmt.Fprintf(&b, "state %p %v seq %d top %d\n", s, s, s.Stats().SeqOut, s.ReplayTop())
	}
	for _, p := range r.d.DB().Policies() {
		fmt.Fprintf(&b, "policy %d %v\n", p.Index, p)
	}
	for _, args := range [][]string{{"-4", "route", "show", "table", "all"}, {"-6", "route", "show", "table", "all"}, {"-4", "rule"}, {"-6", "rule"}} {
		fmt.Fprintf(&b, "ip %v:\n%s", args, r.ns.MustIP(t, args...))
	}
	r.d.mu.Lock()
	defer r.d.mu.Unlock()
	var lines []string
	for k, v := range r.d.file.sas {
		lines = append(lines, fmt.Sprintf("file sa %#x %v: %v %x", k.spi, k.dst, v.cfg, v.keys[:8]))
	}
	for k, v := range r.d.file.policies {
		lines = append(lines, fmt.Sprintf("file policy %v: %v", k, v))
	}
	slices.Sort(lines)
	b.WriteString(strings.Join(lines, "\n"))
	return b.String()
}

// flakyRoutes makes the n-th route install (counting from 1) fail.
type flakyRoutes struct {
	policyRouter
	failAt, installs, removes int
}

func (f *flakyRoutes) InstallPolicyRoute(p sa.Policy) error {
	if f.installs++; f.installs == f.failAt {
		return errors.New("injected route failure")
	}
	return f.policyRouter.InstallPolicyRoute(p)
}

func (f *flakyRoutes) RemovePolicyRoute(p sa.Policy) error {
	f.removes++
	return f.policyRouter.RemovePolicyRoute(p)
}

func (r *running) setRoutes(pr policyRouter) {
	r.d.mu.Lock()
	r.d.routes = pr
	r.d.mu.Unlock()
}

// TestReloadAllOrNothing makes each step of applying a file fail in turn
// (parsing, validation, an inbound SPI that a state of the control socket
// has, a key that one has, a route that cannot be installed) while the
// file also changes a suite under the same key, adds a policy and removes
// another, and checks that the states, policies, routes, rules and the
// file's bookkeeping are exactly as before; then the good file applies.
func TestReloadAllOrNothing(t *testing.T) {
	base := reloadSA("0x1001", "out", gwLocal, gwPeer, "aes128gcm16", keyOut, 1, "") +
		reloadSA("0x2001", "in", gwPeer, gwLocal, "aes128gcm16", keyIn, 1, "") +
		reloadPolicy("198.18.2.0/24", 1) + reloadPolicy("198.18.3.0/24", 1)
	r := start(t, base)
	db := r.d.DB()
	dst := netip.MustParseAddr(gwPeer)
	out, ok := db.GetSA(0x1001, dst)
	if !ok {
		t.Fatal("base configuration not loaded")
	}
	if _, g := out.ReserveSeq(10); g != 10 { // as if 10 packets had been sent
		t.Fatal("no sequence numbers")
	}
	suite, _ := crypto.ParseSuite("aes128gcm16")
	ctlKey := []byte{0x40, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}
	if err := r.d.AddSA(sa.Config{SPI: 0x3001, Dir: sa.DirIn, Src: dst, Dst: netip.MustParseAddr(gwLocal), Suite: suite,
		EncKey: ctlKey, ReplayWindow: 32, ReqID: 5}); err != nil {
		t.Fatal(err)
	}

	// The good file: 0x1001 goes to ESN under the same key, 0x2001 gets
	// ECN off (in place), 198.18.3.0/24 goes, 198.18.4.0/24 and a new
	// state come.
	good := reloadSA("0x1001", "out", gwLocal, gwPeer, "aes128gcm16", keyOut, 1, "esn = true\n") +
		reloadSA("0x2001", "in", gwPeer, gwLocal, "aes128gcm16", keyIn, 1, "ecn = false\n") +
		reloadSA("0x1002", "out", gwLocal, gwPeer, "aes128gcm16", keyNew, 2, "") +
		reloadPolicy("198.18.2.0/24", 1) + reloadPolicy("198.18.4.0/24", 2)
	before := r.snapshot(t)
	for _, tc := range []struct {
		name, file string
		routes     *flakyRoutes
		want       string
	}{
		{"parse", good + "bogus = 1\n", nil, "unknown key"},
		{"validation", good + reloadSA("0x1003", "out", gwLocal, gwPeer, "aes128gcm16", "0x0102", 3, ""), nil, "key"},
		{"inbound SPI clash", good + reloadSA("0x3001", "in", gwPeer, "198.18.0.9", "aes128gcm16", keyNew[:len(keyNew)-2]+"ff", 3, ""), nil, "inbound SPI 0x00003001 is in use"},
		{"key clash", good + reloadSA("0x1003", "out", gwLocal, gwPeer, "aes128gcm16", "0x400102030405060708090a0b0c0d0e0f10111213", 3, ""), nil, "key already in use by state spi 0x00003001 dir in"},
		{"key twice in the file", good + reloadSA("0x1003", "out", gwLocal, gwPeer, "aes128gcm16", keyNew, 3, ""), nil, "key already in use"},
		{"first route", good, &flakyRoutes{failAt: 1}, "injected route failure"},
		{"second route", good + reloadPolicy("198.18.5.0/24", 2), &flakyRoutes{failAt: 2}, "injected route failure"},
		{"control socket's SA", good + reloadSA("0x3001", "in", gwPeer, gwLocal, "aes128gcm16", keyNew, 3, ""), nil, "already installed through the control socket"},
	} {
		if tc.routes != nil {
			tc.routes.policyRouter = r.d.routes
			r.setRoutes(tc.routes)
		}
		if err := os.WriteFile(r.cfg, []byte(tc.file), 0o600); err != nil {
			t.Fatal(err)
		}
		err := r.d.Reload()
		if tc.routes != nil {
			r.setRoutes(tc.routes.policyRouter)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("%s: reload error %v, want %q", tc.name, err, tc.want)
		}
		t.Logf("%s: %v", tc.name, err)
		if after := r.snapshot(t); after != before {
			t.Fatalf("%s: a refused reload changed the running state:\nbefore:\n%s\n\nafter:\n%s", tc.name, before, after)
		}
		if tc.routes != nil && tc.routes.failAt > 1 && tc.routes.removes != tc.routes.failAt-1 {
			t.Errorf("%s: %d routes undone, want %d", tc.name, tc.routes.removes, tc.routes.failAt-1)
		}
	}
	if !out.Alive() {
		t.Fatal("a refused reload removed 0x1001")
	}

	r.reloadWith(t, good)
	n, ok := db.GetSA(0x1001, dst)
	if !ok || n == out || !n.Suite().ESN {
		t.Fatalf("0x1001 not replaced by its ESN version: %v", n)
	}
	if f, _ := n.ReserveSeq(1); f != 11 {
		t.Errorf("0x1001 under the same key restarted at %d, want 11", f)
	}
	if in := db.LookupInbound(0x2001); in == nil || in.Config().ECN {
		t.Error("0x2001 not updated")
	}
	if _, ok := db.GetSA(0x1002, dst); !ok {
		t.Error("0x1002 not added")
	}
	rt := r.routes(t)
	if strings.Contains(rt, "198.18.3.0/24") || !strings.Contains(rt, "198.18.4.0/24") || !strings.Contains(rt, "198.18.2.0/24") {
		t.Errorf("routes after the reload:\n%s", rt)
	}
	if n := len(db.Policies()); n != 2 {
		t.Errorf("%d policies, want 2", n)
	}
}

// TestReloadStoreFailure: when the sequence-number store cannot say what
// a key has sent (here a damaged record), a reload that adds an outbound
// state is refused whole, and says why.
func TestReloadStoreFailure(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	if err := os.MkdirAll(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "seq.log"), []byte(strings.Repeat("damaged record ", 40)), 0o600); err != nil {
		t.Fatal(err)
	}
	base := reloadSA("0x2001", "in", gwPeer, gwLocal, "aes128gcm16", keyIn, 1, "") + reloadPolicy("198.18.2.0/24", 1)
	r := startWith(t, base, state)
	before := r.snapshot(t)
	if err := os.WriteFile(r.cfg, []byte(base+reloadSA("0x1001", "out", gwLocal, gwPeer, "aes128gcm16", keyOut, 1, "")+reloadPolicy("198.18.4.0/24", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	err := r.d.Reload()
	if err == nil || !strings.Contains(err.Error(), "cannot know which sequence numbers key") {
		t.Fatalf("reload with a failing store: %v", err)
	}
	t.Log(err)
	if after := r.snapshot(t); after != before {
		t.Fatalf("a refused reload changed the running state:\nbefore:\n%s\n\nafter:\n%s", before, after)
	}
}

// TestReloadReqidChange changes the reqid of a state and of its policy: the
// reload applies (it used to be refused after the policies were already
// gone), the state continues its sequence numbers, and the policy finds
// it under the new reqid.
func TestReloadReqidChange(t *testing.T) {
	r := start(t, reloadSA("0x1001", "out", gwLocal, gwPeer, "aes128gcm16", keyOut, 1, "")+reloadPolicy("198.18.2.0/24", 1))
	db := r.d.DB()
	s, ok := db.GetSA(0x1001, netip.MustParseAddr(gwPeer))
	if !ok {
		t.Fatal("not loaded")
	}
	s.ReserveSeq(5)
	r.reloadWith(t, reloadSA("0x1001", "out", gwLocal, gwPeer, "aes128gcm16", keyOut, 7, "")+reloadPolicy("198.18.2.0/24", 7))
	n := db.OutboundSA(7)
	if n == nil || n.SPI() != 0x1001 || db.OutboundSA(1) != nil {
		t.Fatalf("reqid change not applied: OutboundSA(7) = %v", n)
	}
	if f, _ := n.ReserveSeq(1); f != 6 {
		t.Errorf("sequence numbers restarted at %d, want 6", f)
	}
	ps := db.Policies()
	if len(ps) != 1 || ps[0].ReqID != 7 {
		t.Errorf("policies after the reload: %v", ps)
	}
	if rt := r.routes(t); !strings.Contains(rt, "198.18.2.0/24") {
		t.Errorf("route gone after the reload:\n%s", rt)
	}
	// And back, through SIGHUP: the running state follows.
	r.hup(t, reloadSA("0x1001", "out", gwLocal, gwPeer, "aes128gcm16", keyOut, 1, "")+reloadPolicy("198.18.2.0/24", 1), func() bool {
		return db.OutboundSA(1) != nil
	})
}

// TestReloadModeChange turns a state and its policy from tunnel into
// transport mode and back: the reload applies (a mode is no update in
// place, so the state is replaced), the replacement continues the key's
// sequence numbers, the policy finds it, and its route becomes a
// transport route (locked MTU) and a tunnel route again.
func TestReloadModeChange(t *testing.T) {
	const hostPolicy = "[[policy]]\nsrc = \"198.18.0.1/32\"\ndst = \"198.18.0.2/32\"\ndir = \"out\"\nreqid = 1\n"
	tunnel := reloadSA("0x1001", "out", gwLocal, gwPeer, "aes128gcm16", keyOut, 1, "") + hostPolicy
	transport := reloadSA("0x1001", "out", gwLocal, gwPeer, "aes128gcm16", keyOut, 1, "mode = \"transport\"\n") +
		hostPolicy + "mode = \"transport\"\n"
	r := start(t, tunnel)
	db := r.d.DB()
	s := db.OutboundSA(1)
	if s == nil || s.Mode() != sa.ModeTunnel {
		t.Fatalf("not loaded in tunnel mode: %v", s)
	}
	s.ReserveSeq(5)
	r.reloadWith(t, transport)
	n := db.OutboundSA(1)
	if n == nil || n.Mode() != sa.ModeTransport {
		t.Fatalf("mode change not applied: OutboundSA(1) = %v", n)
	}
	if f, _ := n.ReserveSeq(1); f != 6 {
		t.Errorf("sequence numbers restarted at %d, want 6", f)
	}
	if ps := db.Policies(); len(ps) != 1 || ps[0].Mode != sa.ModeTransport {
		t.Errorf("policies after the reload: %v", ps)
	}
	if rt := r.routes(t); !strings.Contains(rt, "198.18.0.2") || !strings.Contains(rt, "mtu lock") {
		t.Errorf("no transport route after the reload:\n%s", rt)
	}
	r.reloadWith(t, tunnel)
	if n := db.OutboundSA(1); n == nil || n.Mode() != sa.ModeTunnel {
		t.Fatalf("back to tunnel mode not applied: %v", n)
	}
	if rt := r.routes(t); !strings.Contains(rt, "198.18.0.2") || strings.Contains(rt, "mtu lock") {
		t.Errorf("the route is not a tunnel route again:\n%s", rt)
	}
}
