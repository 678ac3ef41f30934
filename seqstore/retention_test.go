package seqstore

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/espd/espd/crypto"
)

// Retention drops retired negotiated records older than Retain of running
// time, and only those: manual keys, keys in use and recent ones stay, and
// time while no store is open does not count.
func TestRetention(t *testing.T) {
	dir := stateDir(t)
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	o := Options{Retain: 48 * time.Hour, now: clk.now}
	const (
		oldRetired   = 1 // negotiated, retired 3 days ago: dropped
		newRetired   = 2 // negotiated, retired 1 day ago: kept
		oldLive      = 3 // negotiated, reserved 3 days ago, never retired: kept
		oldManual    = 4 // manual, re-added after use, retired 3 days ago: kept
		openRetired  = 5 // negotiated, retired 3 days ago, resumed again later: kept
		neverStarted = 6 // resumed, reserved, retired having sent nothing: nothing to keep
		manualOnce   = 7 // manual, added once, retired 3 days ago: kept
	)
	negotiated := map[int]bool{oldRetired: true, newRetired: true, oldLive: true, openRetired: true, neverStarted: true}
	s := open(t, dir, o)
	for _, k := range []int{oldRetired, oldLive, oldManual, openRetired, neverStarted, manualOnce} {
		resumeAs(t, s, fp(k), negotiated[k])
		must(t, s.Reserve(fp(k), 1<<20))
	}
	must(t, s.Retire(fp(oldManual), 100))
	resume(t, s, fp(oldManual)) // added again: 100 were used
	must(t, s.Reserve(fp(oldManual), 100+1<<20))
	for _, k := range []int{oldRetired, oldManual, openRetired, manualOnce} {
		must(t, s.Retire(fp(k), 1000))
	}
	must(t, s.Retire(fp(neverStarted), 0))
	clk.add(2 * 24 * time.Hour)
	resumeAs(t, s, fp(newRetired), true)
	must(t, s.Reserve(fp(newRetired), 1<<20))
	must(t, s.Retire(fp(newRetired), 2000))
	must(t, s.Close())

	// Switched off for a year: the run clock does not move.
	clk.add(365 * 24 * time.Hour)
	s = open(t, dir, o)
	// (Looked up without Resume, which would make them in use.)
	for _, k := range []int{oldRetired, oldManual, newRetired, manualOnce} {
		if _, ok := s.entries[fp(k)]; !ok {
			t.Errorf("key %d dropped while espd was not running", k)
		}
	}
	if e, ok := s.entries[fp(neverStarted)]; ok {
		t.Errorf("a key that sent nothing is kept: %+v", e)
	}
	clk.add(24*time.Hour + time.Minute) // oldRetired is now 3 days old in run time
	resumeAs(t, s, fp(openRetired), true)
	must(t, s.Reserve(fp(openRetired), 1000+1<<20))
	must(t, s.Close())

	s = open(t, dir, o)
	defer s.Close()
	want := map[int]uint64{oldRetired: 0, newRetired: 2000, oldLive: 1 << 20, oldManual: 1000, manualOnce: 1000}
	for k, w := range want {
		if v := resumeAs(t, s, fp(k), negotiated[k]); v != w {
			t.Errorf("key %d: Resume = %d, want %d", k, v, w)
		}
	}
	// openRetired was resumed by the last run and never retired: in use.
	if v := resumeAs(t, s, fp(openRetired), true); v != 1000+1<<20 {
		t.Errorf("key resumed and not retired: Resume = %d, want %d", v, 1000+1<<20)
	}
}

// retireAged writes key k's record as retired after sending last, then
// lets d of run time pass in steps, forcing a compaction after each, and
// reopens the store; it returns the reopened store.
func retireAged(t *testing.T, dir string, clk *fakeClock, o Options, k crypto.Fingerprint, negotiated bool, last uint64, d time.Duration, steps int) *Store {
	t.Helper()
	s := open(t, dir, o)
	resumeAs(t, s, k, negotiated)
	must(t, s.Reserve(k, last+1<<20))
	must(t, s.Retire(k, last))
	for range steps {
		clk.add(d / time.Duration(steps))
		s.wg.Wait() // a background compaction started by the writes
		s.mu.Lock()
		err := s.compactLocked()
		s.mu.Unlock()
		must(t, err)
	}
	must(t, s.Close())
	return open(t, dir, o)
}

// A manual key's retired record is never dropped: far beyond Retain,
// across compactions and reopens, it resumes exactly above its last
// number (a manually keyed tunnel taken out for a month and put back).
func TestManualKeptForever(t *testing.T) {
	dir := stateDir(t)
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	o := Options{Retain: time.Hour, now: clk.now, minCompact: 1}
	s := retireAged(t, dir, clk, o, fp(1), false, 4242, 1000*time.Hour, 10)
	if s.compactCount == 0 {
		t.Fatal("no compaction at Open")
	}
	// Another reopen, with more run time behind it.
	clk.add(1000 * time.Hour)
	must(t, s.Close())
	s = open(t, dir, o)
	defer s.Close()
	if v := resume(t, s, fp(1)); v != 4242 {
		t.Fatalf("manual key 2000 hours of run time after its retirement (Retain 1h): Resume = %d, want 4242", v)
	}
}

// A negotiated key's retired record is dropped after Retain of run time,
// and not before.
func TestNegotiatedExpires(t *testing.T) {
	const retain = 10 * time.Hour
	for _, tc := range []struct {
		age  time.Duration
		want uint64
	}{
		{retain - time.Minute, 4242},
		{retain + time.Minute, 0},
	} {
		t.Run(tc.age.String(), func(t *testing.T) {
			dir := stateDir(t)
			clk := &fakeClock{t: time.Unix(1e9, 0)}
			o := Options{Retain: retain, now: clk.now, minCompact: 1}
			s := retireAged(t, dir, clk, o, fp(1), true, 4242, tc.age, 3)
			defer s.Close()
			if v := resumeAs(t, s, fp(1), true); v != tc.want {
				t.Errorf("negotiated key retired %v ago (Retain %v): Resume = %d, want %d", tc.age, retain, v, tc.want)
			}
		})
	}
}

// A key is negotiated only while every Resume of it says so.
func TestOriginMixed(t *testing.T) {
	const retain = time.Hour
	long := 100 * retain
	t.Run("manual then negotiated stays manual", func(t *testing.T) {
		dir := stateDir(t)
		clk := &fakeClock{t: time.Unix(1e9, 0)}
		o := Options{Retain: retain, now: clk.now, minCompact: 1}
		s := open(t, dir, o)
		resume(t, s, fp(1))
		must(t, s.Reserve(fp(1), 1<<20))
		must(t, s.Retire(fp(1), 10))
		if v := resumeAs(t, s, fp(1), true); v != 10 {
			t.Fatalf("Resume = %d, want 10", v)
		}
		must(t, s.Retire(fp(1), 20))
		must(t, s.Close())
		s = retireAged(t, dir, clk, o, fp(1), true, 30, long, 2)
		defer s.Close()
		if e := s.entries[fp(1)]; e.flags&flagNegotiated != 0 {
			t.Errorf("manual key recorded as negotiated after a negotiated Resume: %+v", e)
		}
		if v := resumeAs(t, s, fp(1), true); v != 30 {
			t.Errorf("Resume = %d, want 30", v)
		}
	})
	t.Run("negotiated then manual becomes manual", func(t *testing.T) {
		dir := stateDir(t)
		clk := &fakeClock{t: time.Unix(1e9, 0)}
		o := Options{Retain: retain, now: clk.now, minCompact: 1}
		s := open(t, dir, o)
		resumeAs(t, s, fp(1), true)
		must(t, s.Reserve(fp(1), 1<<20))
		must(t, s.Retire(fp(1), 10))
		must(t, s.Close())
		s = open(t, dir, o)
		if e := s.entries[fp(1)]; e.flags&flagNegotiated == 0 {
			t.Fatalf("negotiated key not recorded as negotiated: %+v", e)
		}
		// Added by hand: the record turns manual before Resume returns,
		// durably, with no Retire or Reserve after it (a crash right
		// after Resume).
		if v := resume(t, s, fp(1)); v != 10 {
			t.Fatalf("Resume = %d, want 10", v)
		}
		b, err := os.ReadFile(filepath.Join(dir, LogName))
		must(t, err)
		last, err := parse(b[len(b)-recordSize:])
		must(t, err)
		if last.fp != fp(1) || last.flags&flagNegotiated != 0 {
			t.Fatalf("last record after a manual Resume: %+v, want the key without flagNegotiated", last)
		}
		must(t, s.Retire(fp(1), 20))
		clk.add(long)
		must(t, s.Close())
		s = open(t, dir, o)
		defer s.Close()
		if v := resumeAs(t, s, fp(1), true); v != 20 {
			t.Errorf("key added by hand once, then %v of run time after its retirement: Resume = %d, want 20", long, v)
		}
	})
	// Two states of a new key (inbound and outbound of a loopback
	// setup), one of them manual, before its first record.
	for _, first := range []bool{true, false} {
		t.Run(fmt.Sprintf("two sessions before the first record, first negotiated %v", first), func(t *testing.T) {
			dir := stateDir(t)
			clk := &fakeClock{t: time.Unix(1e9, 0)}
			o := Options{Retain: retain, now: clk.now, minCompact: 1}
			s := open(t, dir, o)
			resumeAs(t, s, fp(1), first)
			resumeAs(t, s, fp(1), !first)
			must(t, s.Reserve(fp(1), 1<<20))
			must(t, s.Retire(fp(1), 10))
			must(t, s.Retire(fp(1), 10))
			clk.add(long)
			must(t, s.Close())
			s = open(t, dir, o)
			defer s.Close()
			if v := resume(t, s, fp(1)); v != 10 {
				t.Errorf("Resume = %d, want 10", v)
			}
		})
	}
}

// A log written before the origin was recorded (every record's flags 0,
// or flagReused) keeps every record, however old: nothing in it says a
// key was negotiated.
func TestOldLogKeepsAll(t *testing.T) {
	dir := stateDir(t)
	must(t, os.MkdirAll(dir, 0o700))
	var buf bytes.Buffer
	var b [recordSize]byte
	put := func(r record) { r.put(&b); buf.Write(b[:]) }
	put(record{kind: kindHeader, value: formatV1, fp: magic})
	put(record{kind: kindReserve, value: 1 << 20, clock: 10, fp: fp(1)})
	put(record{kind: kindRetire, value: 77, clock: 20, fp: fp(1)})
	put(record{kind: kindRetire, flags: flagReused, value: 88, clock: 30, fp: fp(2)})
	put(record{kind: kindReserve, value: 1 << 21, clock: 40, fp: fp(3)})
	put(record{kind: kindClock, clock: 365 * 24 * 3600})
	must(t, os.WriteFile(filepath.Join(dir, LogName), buf.Bytes(), 0o600))
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	o := Options{Retain: time.Hour, now: clk.now, minCompact: 1}
	s := open(t, dir, o)
	clk.add(365 * 24 * time.Hour)
	must(t, s.Close())
	s = open(t, dir, o)
	defer s.Close()
	for k, w := range map[int]uint64{1: 77, 2: 88, 3: 1 << 21} {
		if v := resumeAs(t, s, fp(k), true); v != w {
			t.Errorf("key %d of an old log: Resume = %d, want %d", k, v, w)
		}
	}
}

// A negative Retain keeps every retired record.
func TestRetainForever(t *testing.T) {
	dir := stateDir(t)
	clk := &fakeClock{t: time.Unix(1e9, 0)}
	o := Options{Retain: -1, now: clk.now}
	s := open(t, dir, o)
	resume(t, s, fp(1))
	must(t, s.Reserve(fp(1), 1<<20))
	must(t, s.Retire(fp(1), 5))
	clk.add(10 * 365 * 24 * time.Hour)
	must(t, s.Close())
	s = open(t, dir, o)
	defer s.Close()
	if v := resume(t, s, fp(1)); v != 5 {
		t.Errorf("Resume = %d, want 5", v)
	}
}
