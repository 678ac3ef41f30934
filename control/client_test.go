package control

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/packet"
	"github.com/espd/espd/sa"
)

// testServer is a Server over a fresh sa.DB on a socket in a temporary
// directory.
type testServer struct {
	*Server
	db   *sa.DB
	path string
}

func startServer(t *testing.T, cfg ServerConfig) *testServer {
	t.Helper()
	db := sa.NewDB(sa.Options{AcquireInterval: -1, AcquireRate: -1}) // tests flood acquires
	if cfg.Path == "" {
		cfg.Path = filepath.Join(t.TempDir(), "run", "espd.sock")
	}
	if cfg.Logf == nil {
		cfg.Logf = t.Logf
	}
	s := serveT(t, dbBackend{db}, cfg)
	return &testServer{Server: s, db: db, path: cfg.Path}
}

// serveT starts a Server over b with cfg, serving until the test ends.
func serveT(t *testing.T, b Backend, cfg ServerConfig) *Server {
	t.Helper()
	s, err := Listen(b, cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func dial(t *testing.T, path string) *Client {
	t.Helper()
	c, err := Dial(testCtx(t), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func wantCode(t *testing.T, err error, code wire.Errno) {
	t.Helper()
	var e *wire.Error
	if !errors.As(err, &e) || e.Code != code {
		t.Fatalf("error %v, want %v", err, code)
	}
}

func TestClientSARoundTrips(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	c := dial(t, ts.path)
	ctx := testCtx(t)
	if c.Server.Version != wire.Version || c.Server.Software != Software || c.Server.MaxMessageSize != wire.MaxMessageSize {
		t.Fatalf("hello: %+v", c.Server)
	}

	spi, err := c.AllocSPI(ctx, 0x1000, 0x1003)
	if err != nil || spi < 0x1000 || spi > 0x1003 {
		t.Fatalf("AllocSPI: %x %v", spi, err)
	}
	if spi2, err := c.AllocSPI(ctx, 0, 0); err != nil || spi2 < wire.DefaultSPIMin || spi2 > wire.DefaultSPIMax {
		t.Fatalf("AllocSPI default range: %x %v", spi2, err)
	}
	_, err = c.AllocSPI(ctx, 5, 4)
	wantCode(t, err, wire.EINVAL)

	in := gcmConfig(t, spi)
	in.Selectors = []sa.Selector{{Src: netip.MustParsePrefix("2001:db8:a::/48"), Dst: netip.MustParsePrefix("2001:db8:b::/48")}}
	in.Soft = sa.Lifetime{Packets: 1000, AddTime: time.Hour}
	in.Hard = sa.Lifetime{Packets: 2000, AddTime: 2 * time.Hour}
	before := time.Now()
	if err := c.AddSA(ctx, in); err != nil {
		t.Fatal(err)
	}
	wantCode(t, c.AddSA(ctx, in), wire.EEXIST)
	out := fullConfig(t)
	if err := c.AddSA(ctx, out); err != nil {
		t.Fatal(err)
	}

	got, err := c.GetSA(ctx, in.SPI, in.Dst)
	if err != nil {
		t.Fatal(err)
	}
	want := in
	want.EncKey, want.IntegKey = nil, nil
	if !sameConfig(got.Config, want) || got.Config.EncKey != nil || got.Config.IntegKey != nil {
		t.Fatalf("GetSA:\n got %v\nwant %v", got.Config, want)
	}
	if got.Stats.State != sa.StateValid || got.Stats.AddTime.Before(before.Add(-time.Second)) || !got.Stats.FirstUse.IsZero() {
		t.Fatalf("GetSA stats: %+v", got.Stats)
	}
	_, err = c.GetSA(ctx, 0x999, in.Dst)
	wantCode(t, err, wire.ENOENT)
	if !errors.Is(err, syscall.ENOENT) {
		t.Fatal("errors.Is(err, syscall.ENOENT)")
	}

	// Counters and use time come back.
	s, _ := ts.db.GetSA(in.SPI, in.Dst)
	s.Account(3, 300)
	s.Drop(sa.DropReplay, 2)
	got, err = c.GetSA(ctx, in.SPI, in.Dst)
	if err != nil || got.Stats.Packets != 3 || got.Stats.Bytes != 300 || got.Stats.Drops[sa.DropReplay] != 2 || got.Stats.FirstUse.IsZero() {
		t.Fatalf("counters: %+v %v", got.Stats, err)
	}

	list, err := c.ListSAs(ctx)
	if err != nil || len(list) != 3 { // two states and the second SPI reservation
		t.Fatalf("ListSAs: %d %v", len(list), err)
	}
	if list[1].Config.SPI != in.SPI || list[2].Config.SPI != out.SPI || list[0].Stats.State != sa.StateLarval {
		t.Fatalf("ListSAs order/state: %v / %v / %v", list[0].Config, list[1].Config, list[2].Config)
	}

	// SA_UPDATE: move the outbound state to a new destination and turn
	// UDP encapsulation off; the rest is kept.
	newDst := netip.MustParseAddr("198.18.0.9")
	upd := out
	upd.Dst, upd.EncapSrcPort, upd.EncapDstPort = newDst, 0, 0
	if err := c.UpdateSA(ctx, wire.SAUpdate{SPI: out.SPI, Dst: out.Dst, Config: upd, Fields: wire.FieldDst | wire.FieldEncap}); err != nil {
		t.Fatal(err)
	}
	got, err = c.GetSA(ctx, out.SPI, newDst)
	if err != nil {
		t.Fatal(err)
	}
	wantOut := upd
	wantOut.EncKey, wantOut.IntegKey = nil, nil
	if !sameConfig(got.Config, wantOut) {
		t.Fatalf("after update:\n got %v\nwant %v", got.Config, wantOut)
	}
	// Immutable fields are refused by the database, not silently kept.
	bad := upd
	bad.ReqID = 99
	err = c.UpdateSA(ctx, wire.SAUpdate{SPI: out.SPI, Dst: newDst, Config: bad, Fields: wire.FieldReqID})
	wantCode(t, err, wire.EINVAL)
	err = c.UpdateSA(ctx, wire.SAUpdate{SPI: 0x4242, Dst: newDst, Config: bad, Fields: wire.FieldTTL})
	wantCode(t, err, wire.ENOENT)

	st, err := c.Stats(ctx)
	if err != nil || st.Global.States != 2 || st.Global.Larval != 1 || len(st.SAs) != 3 || st.Global.Packets != 3 {
		t.Fatalf("Stats: %+v %v", st, err)
	}
	one, err := c.SAStats(ctx, in.SPI, in.Dst)
	if err != nil || len(one.SAs) != 1 || one.SAs[0].Stats.Packets != 3 || one.SAs[0].Config.ReqID != in.ReqID ||
		one.SAs[0].Config.Dir != sa.DirIn || one.SAs[0].Config.Src != in.Src {
		t.Fatalf("SAStats: %+v %v", one, err)
	}

	if err := c.DeleteSA(ctx, in.SPI, in.Dst); err != nil {
		t.Fatal(err)
	}
	_, err = c.GetSA(ctx, in.SPI, in.Dst)
	wantCode(t, err, wire.ENOENT)
	wantCode(t, c.DeleteSA(ctx, in.SPI, in.Dst), wire.ENOENT)
	if err := c.FlushSAs(ctx); err != nil {
		t.Fatal(err)
	}
	if list, err := c.ListSAs(ctx); err != nil || len(list) != 0 {
		t.Fatalf("after flush: %d %v", len(list), err)
	}
	// Invalid configurations get the database's reason.
	short := gcmConfig(t, 0x777)
	short.EncKey = short.EncKey[:5]
	err = c.AddSA(ctx, short)
	wantCode(t, err, wire.EINVAL)
	t.Logf("short key: %v", err)
}

func TestClientPolicyRoundTrips(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	c := dial(t, ts.path)
	ctx := testCtx(t)
	p := fullPolicy()
	got, err := c.AddPolicy(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if got.Index == 0 || got.Index%8 != 2 {
		t.Fatalf("index %d", got.Index)
	}
	p.Index = got.Index
	if got != p {
		t.Fatalf("AddPolicy:\n got %v\nwant %v", got, p)
	}
	_, err = c.AddPolicy(ctx, p)
	wantCode(t, err, wire.EEXIST)
	if g, err := c.GetPolicy(ctx, p.ID()); err != nil || g != p {
		t.Fatalf("GetPolicy: %v %v", g, err)
	}
	p.Action, p.Priority = sa.ActionBypass, 7
	if u, err := c.UpdatePolicy(ctx, p); err != nil || u.Action != sa.ActionBypass || u.Priority != 7 {
		t.Fatalf("UpdatePolicy: %v %v", u, err)
	}
	out := sa.Policy{Selector: sa.Selector{Dst: netip.MustParsePrefix("2001:db8::/32")}, Dir: sa.DirOut, ReqID: 3,
		TmplSrc: v6a, TmplDst: v6b}
	if _, err := c.AddPolicy(ctx, out); err != nil {
		t.Fatal(err)
	}
	list, err := c.ListPolicies(ctx)
	if err != nil || len(list) != 2 {
		t.Fatalf("ListPolicies: %v %v", list, err)
	}
	if err := c.DeletePolicy(ctx, p.ID()); err != nil {
		t.Fatal(err)
	}
	_, err = c.GetPolicy(ctx, p.ID())
	wantCode(t, err, wire.ENOENT)
	wantCode(t, c.DeletePolicy(ctx, p.ID()), wire.ENOENT)
	if err := c.FlushPolicies(ctx); err != nil {
		t.Fatal(err)
	}
	if list, err := c.ListPolicies(ctx); err != nil || len(list) != 0 {
		t.Fatalf("after flush: %v %v", list, err)
	}
}

func TestClientEvents(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	c := dial(t, ts.path)
	ctx := testCtx(t)
	events, err := c.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Subscribe(ctx)
	wantCode(t, err, wire.EALREADY)
	// A filtered subscriber on another connection.
	c2 := dial(t, ts.path)
	expOnly, err := c2.Subscribe(ctx, wire.EventSoftExpire, wire.EventHardExpire)
	if err != nil {
		t.Fatal(err)
	}

	pol, err := c.AddPolicy(ctx, sa.Policy{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.0.0/16")},
		Dir: sa.DirOut, ReqID: 5, TmplSrc: v4a, TmplDst: v4b})
	if err != nil {
		t.Fatal(err)
	}
	flow := packet.Flow{Src: netip.MustParseAddr("198.18.5.5"), Dst: netip.MustParseAddr("198.19.1.1"), Proto: 17, SrcPort: 1000, DstPort: 53}
	if !ts.db.Acquire(pol, flow) {
		t.Fatal("no acquire fired")
	}
	cfg := gcmConfig(t, 0x5000)
	cfg.Dir, cfg.Src, cfg.Dst = sa.DirOut, v4a, v4b
	cfg.Soft, cfg.Hard = sa.Lifetime{Packets: 2}, sa.Lifetime{Packets: 4}
	if err := c.AddSA(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	s, _ := ts.db.GetSA(cfg.SPI, cfg.Dst)
	s.Account(2, 200)
	s.Account(2, 200)

	next := func(ch <-chan wire.Event) wire.Event {
		t.Helper()
		select {
		case e, ok := <-ch:
			if !ok {
				t.Fatal("event channel closed")
			}
			return e
		case <-ctx.Done():
			t.Fatal("no event")
		}
		return wire.Event{}
	}
	e := next(events)
	if e.Kind != wire.EventAcquire || e.ReqID != 5 || e.Flow != flow || e.Policy != pol || e.Time.IsZero() {
		t.Fatalf("acquire: %+v", e)
	}
	e = next(events)
	if e.Kind != wire.EventSoftExpire || e.SPI != cfg.SPI || e.Dst != cfg.Dst || e.Reason != sa.ExpirePackets || e.ReqID != cfg.ReqID || e.Dir != sa.DirOut {
		t.Fatalf("soft expire: %+v", e)
	}
	e = next(events)
	if e.Kind != wire.EventHardExpire || e.SPI != cfg.SPI || e.Reason != sa.ExpirePackets {
		t.Fatalf("hard expire: %+v", e)
	}
	if e := next(expOnly); e.Kind != wire.EventSoftExpire {
		t.Fatalf("filtered subscriber got %v first", e)
	}
	if e := next(expOnly); e.Kind != wire.EventHardExpire {
		t.Fatalf("filtered subscriber got %v second", e)
	}
	// The subscribed connection still answers requests.
	if _, err := c.ListSAs(ctx); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, ok := <-events; ok {
		t.Fatal("event channel open after Close")
	}
	if _, err := c.ListSAs(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("request after Close: %v", err)
	}
}

func TestClientContext(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	c := dial(t, ts.path)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.ListSAs(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled context: %v", err)
	}
	// The connection is still usable.
	if _, err := c.ListSAs(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := Dial(testCtx(t), filepath.Join(t.TempDir(), "none.sock")); err == nil || !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("dial to nothing: %v", err)
	}
}

// slowBackend blocks ListSAs until release is closed.
type slowBackend struct {
	dbBackend
	release chan struct{}
}

func (b slowBackend) ListSAs() ([]wire.SAInfo, error) {
	<-b.release
	return b.dbBackend.ListSAs()
}

// TestClientDeadline: a request whose context ends while the server is
// busy returns the context's error; its late reply is discarded and the
// connection keeps working.
func TestClientDeadline(t *testing.T) {
	b := slowBackend{dbBackend{sa.NewDB(sa.Options{})}, make(chan struct{})}
	s, err := Listen(b, ServerConfig{Path: filepath.Join(t.TempDir(), "espd.sock")})
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	t.Cleanup(func() { s.Close() })
	c := dial(t, s.Path())
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.ListSAs(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ListSAs: %v", err)
	}
	close(b.release)
	if _, err := c.AllocSPI(testCtx(t), 0x300, 0x300); err != nil {
		t.Fatal(err)
	}
	list, err := c.ListSAs(testCtx(t))
	if err != nil || len(list) != 1 || list[0].Config.SPI != 0x300 {
		t.Fatalf("after the late reply: %v %v", list, err)
	}
}

// TestClientZeroKeyRefused: a state whose encryption or integrity key is
// all zeros is refused over the control socket (EINVAL, not installed), as
// espctl's key files and the configuration file refuse it.
func TestClientZeroKeyRefused(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	c := dial(t, ts.path)
	ctx := testCtx(t)
	gcm := gcmConfig(t, 0x2100)
	clear(gcm.EncKey)
	err := c.AddSA(ctx, gcm)
	wantCode(t, err, wire.EINVAL)
	if err == nil || !strings.Contains(err.Error(), "all zeros") {
		t.Errorf("zero encryption key: %v, want it named", err)
	}
	cbc := fullConfig(t)
	clear(cbc.IntegKey)
	wantCode(t, c.AddSA(ctx, cbc), wire.EINVAL)
	if states, err := c.ListSAs(ctx); err != nil || len(states) != 0 {
		t.Errorf("after the refusals: %d states, %v; want none", len(states), err)
	}
}
