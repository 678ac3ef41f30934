package sa

import (
	"context"
	"testing"
	"time"
)

func TestCountLifetimes(t *testing.T) {
	for _, tc := range []struct {
		name       string
		soft, hard Lifetime
		packets    uint64 // per Account call
		bytes      uint64
		softAt     int // Account calls until the soft expiry
		hardAt     int
		reason     ExpireReason
	}{
		{"packets", Lifetime{Packets: 100}, Lifetime{Packets: 150}, 10, 1, 10, 15, ExpirePackets},
		{"bytes", Lifetime{Bytes: 5000}, Lifetime{Bytes: 8000}, 1, 1000, 5, 8, ExpireBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db, _ := newTestDB(t)
			zeroed := watchZero(t)
			sub := db.Subscribe(8)
			c := testConfig(0x2100, DirOut, 2)
			c.Soft, c.Hard = tc.soft, tc.hard
			s := mustAdd(t, db, c)
			for i := 1; i <= tc.hardAt; i++ {
				s.Account(tc.packets, tc.bytes)
				switch {
				case i < tc.softAt:
					noEvent(t, sub)
					if s.State() != StateValid {
						t.Fatalf("call %d: %v", i, s.State())
					}
				case i == tc.softAt:
					ev := nextEvent(t, sub)
					if ev.Kind != EventSoftExpire || ev.Reason != tc.reason || ev.SPI != 0x2100 || ev.ReqID != 2 {
						t.Fatalf("call %d: %v", i, ev)
					}
					if s.State() != StateSoftExpired || !s.Alive() || db.OutboundSA(2) != s {
						t.Fatalf("soft-expired state unusable: %v", s.State())
					}
				case i < tc.hardAt:
					noEvent(t, sub) // soft fires once
				default:
					ev := nextEvent(t, sub)
					if ev.Kind != EventHardExpire || ev.Reason != tc.reason {
						t.Fatalf("call %d: %v", i, ev)
					}
				}
			}
			if s.Alive() || db.OutboundSA(2) != nil {
				t.Fatal("hard-expired state still usable")
			}
			if _, ok := db.GetSA(0x2100, remote); ok {
				t.Fatal("hard-expired state still found")
			}
			if !zeroed(s) || !keysZero(s) {
				t.Fatal("hard-expired state's keys not zeroed")
			}
			s.Account(tc.packets, tc.bytes) // late batches: counted, no new event
			noEvent(t, sub)
		})
	}
}

func TestTimeLifetimes(t *testing.T) {
	db, clock := newTestDB(t)
	sub := db.Subscribe(16)
	add := func(spi uint32, soft, hard Lifetime) *SA {
		c := testConfig(spi, DirIn, 1)
		c.Soft, c.Hard = soft, hard
		return mustAdd(t, db, c)
	}
	byAdd := add(0x2200, Lifetime{AddTime: 50 * time.Second}, Lifetime{AddTime: 60 * time.Second})
	byUse := add(0x2201, Lifetime{UseTime: 10 * time.Second}, Lifetime{UseTime: 20 * time.Second})
	forever := add(0x2202, Lifetime{}, Lifetime{})

	clock.Advance(30 * time.Second)
	db.tick()
	noEvent(t, sub) // byUse was never used: its use-time clock has not started
	byUse.Account(1, 100)
	if st := byUse.Stats(); !st.FirstUse.Equal(clock.Now()) {
		t.Errorf("first use %v, want %v", st.FirstUse, clock.Now())
	}
	byUse.Account(1, 100) // a later use does not move the first use
	clock.Advance(10 * time.Second)
	db.tick()
	ev := nextEvent(t, sub)
	if ev.Kind != EventSoftExpire || ev.SPI != 0x2201 || ev.Reason != ExpireUseTime || !ev.Time.Equal(clock.Now()) {
		t.Fatalf("at 40 s: %v", ev)
	}
	noEvent(t, sub)
	clock.Advance(10 * time.Second)
	db.tick()
	got := map[uint32]Event{}
	for range 2 {
		ev := nextEvent(t, sub)
		got[ev.SPI] = ev
	}
	if ev := got[0x2200]; ev.Kind != EventSoftExpire || ev.Reason != ExpireAddTime {
		t.Errorf("at 50 s, by add time: %v", ev)
	}
	if ev := got[0x2201]; ev.Kind != EventHardExpire || ev.Reason != ExpireUseTime {
		t.Errorf("at 50 s, by use time: %v", ev)
	}
	clock.Advance(10 * time.Second)
	db.tick()
	if ev := nextEvent(t, sub); ev.Kind != EventHardExpire || ev.SPI != 0x2200 || ev.Reason != ExpireAddTime {
		t.Errorf("at 60 s: %v", ev)
	}
	noEvent(t, sub)
	if byAdd.Alive() || byUse.Alive() || !forever.Alive() {
		t.Error("wrong states alive after their lifetimes")
	}
	if db.LookupInbound(0x2200) != nil || db.LookupInbound(0x2201) != nil || db.LookupInbound(0x2202) != forever {
		t.Error("lookups disagree with the lifetimes")
	}
	if st := forever.Stats(); !st.AddTime.Equal(clock.Now().Add(-60*time.Second)) || !st.FirstUse.IsZero() {
		t.Errorf("forever: added %v, first use %v", st.AddTime, st.FirstUse)
	}
}

// TestUpdateSALowersLimit: a hard limit lowered below the counters by
// UpdateSA takes effect at the next tick, even without traffic.
func TestUpdateSALowersLimit(t *testing.T) {
	db, _ := newTestDB(t)
	sub := db.Subscribe(4)
	s := mustAdd(t, db, testConfig(0x2300, DirOut, 1))
	s.Account(10, 1000)
	c := s.Config()
	c.Hard.Packets = 5
	if err := db.UpdateSA(c); err != nil {
		t.Fatal(err)
	}
	db.tick()
	if ev := nextEvent(t, sub); ev.Kind != EventHardExpire || ev.Reason != ExpirePackets {
		t.Fatalf("event %v", ev)
	}
}

// TestRun drives Run with a short real tick and a fake clock.
func TestRun(t *testing.T) {
	clock := newFakeClock()
	db := NewDB(Options{Now: clock.Now, TickInterval: time.Millisecond})
	sub := db.Subscribe(4)
	c := testConfig(0x2500, DirIn, 1)
	c.Hard.AddTime = time.Minute
	mustAdd(t, db, c)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		db.Run(ctx)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	clock.Advance(time.Minute)
	if ev := nextEvent(t, sub); ev.Kind != EventHardExpire || ev.Reason != ExpireAddTime {
		t.Fatalf("event %v", ev)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}
