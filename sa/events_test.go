package sa

import (
	"net/netip"
	"testing"
	"time"
)

// TestSlowSubscriber: a subscriber that does not read loses events (counted)
// and never blocks the data path; other subscribers still get them.
func TestSlowSubscriber(t *testing.T) {
	db, _ := newTestDB(t)
	slow := db.Subscribe(1)
	fast := db.Subscribe(100)
	for i := range uint32(5) {
		c := testConfig(0x3100+i, DirOut, 1)
		c.Soft.Packets = 1
		s := mustAdd(t, db, c)
		s.Account(1, 1) // fires a soft expiry synchronously
	}
	if len(fast.Events()) != 5 {
		t.Errorf("fast subscriber has %d events, want 5", len(fast.Events()))
	}
	if slow.Dropped() != 4 || len(slow.Events()) != 1 {
		t.Errorf("slow subscriber: %d dropped, %d queued; want 4 and 1", slow.Dropped(), len(slow.Events()))
	}
	if g := db.Stats(); g.EventsDropped != 4 {
		t.Errorf("global events dropped %d", g.EventsDropped)
	}
	slow.Close()
	slow.Close()
	// The channel is closed after the queued event.
	<-slow.Events()
	if _, ok := <-slow.Events(); ok {
		t.Error("closed subscription still delivers")
	}
	c := testConfig(0x3200, DirOut, 1)
	c.Soft.Packets = 1
	mustAdd(t, db, c).Account(1, 1) // publishing after Close must not panic
	if len(fast.Events()) != 6 {
		t.Error("remaining subscriber missed an event")
	}
}

func TestAcquireRateLimit(t *testing.T) {
	db, clock := newTestDB(t)
	sub := db.Subscribe(16)
	p, err := db.AddPolicy(Policy{Selector: Selector{Dst: pfx("198.19.0.0/16")}, Dir: DirOut, ReqID: 12,
		TmplSrc: local, TmplDst: remote})
	if err != nil {
		t.Fatal(err)
	}
	f := flow("198.18.0.10", "198.19.0.10", 6, 5000, 80)
	if !db.Acquire(p, f) {
		t.Fatal("first acquire suppressed")
	}
	ev := nextEvent(t, sub)
	if ev.Kind != EventAcquire || ev.ReqID != 12 || ev.Policy != p || ev.Flow != f || ev.Dst != f.Dst || !ev.Time.Equal(clock.Now()) {
		t.Fatalf("acquire event %v", ev)
	}
	for range 10 {
		if db.Acquire(p, f) {
			t.Fatal("acquire within the interval not suppressed")
		}
	}
	// Another destination of the same policy, or another policy, is not
	// held back.
	f2 := f
	f2.Dst = netip.MustParseAddr("198.19.0.11")
	if !db.Acquire(p, f2) {
		t.Error("acquire for another destination suppressed")
	}
	p2, _ := db.AddPolicy(Policy{Selector: Selector{Dst: pfx("198.19.0.0/24")}, Dir: DirOut, ReqID: 13})
	if !db.Acquire(p2, f) {
		t.Error("acquire for another policy suppressed")
	}
	clock.Advance(999 * time.Millisecond)
	if db.Acquire(p, f) {
		t.Error("acquire after 999 ms not suppressed")
	}
	clock.Advance(time.Millisecond)
	if !db.Acquire(p, f) {
		t.Error("acquire after the interval suppressed")
	}
	g := db.Stats()
	if g.Acquires != 4 || g.AcquiresSuppressed != 11 {
		t.Errorf("acquires %d, suppressed %d; want 4 and 11", g.Acquires, g.AcquiresSuppressed)
	}
	// Ticks forget stale entries; the limit still holds for fresh ones.
	clock.Advance(time.Second)
	db.tick()
	if n := db.evdb.acq.len(); n != 0 {
		t.Errorf("%d rate-limit entries left after a tick", n)
	}
	if !db.Acquire(p, f) || db.Acquire(p, f) {
		t.Error("rate limit wrong after pruning")
	}
}

func TestAcquireUnlimited(t *testing.T) {
	clock := newFakeClock()
	db := NewDB(Options{Now: clock.Now, AcquireInterval: -1})
	f := flow("198.18.0.10", "198.19.0.10", 6, 5000, 80)
	for range 3 {
		if !db.Acquire(Policy{Index: 8}, f) {
			t.Fatal("acquire suppressed without a limit")
		}
	}
}

func TestAcquireSuppressedNoAlloc(t *testing.T) {
	db, _ := newTestDB(t)
	f := flow("198.18.0.10", "198.19.0.10", 6, 5000, 80)
	p := Policy{Index: 8, ReqID: 1}
	db.Acquire(p, f)
	if n := testing.AllocsPerRun(1000, func() {
		if db.Acquire(p, f) {
			t.Fatal("not suppressed")
		}
	}); n != 0 {
		t.Errorf("suppressed Acquire allocates %v times", n)
	}
}

func TestEventStrings(t *testing.T) {
	ev := Event{Kind: EventHardExpire, SPI: 0xc0ffee, Dst: remote, Dir: DirOut, ReqID: 3, Reason: ExpireBytes}
	if got, want := ev.String(), "hard-expire spi 0x00c0ffee dst 198.18.0.2 dir out reqid 3: byte limit"; got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}
