package seqstore

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/espd/espd/crypto"
)

// fp returns a distinct fingerprint for i.
func fp(i int) crypto.Fingerprint {
	return crypto.KeyFingerprint([]byte(fmt.Sprintf("key %d", i)), nil)
}

// fakeClock is a settable clock for retention tests.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func open(t *testing.T, dir string, o Options) *Store {
	t.Helper()
	s, err := Open(dir, o)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

// resume resumes k as a manual key.
func resume(t *testing.T, s *Store, k crypto.Fingerprint) uint64 {
	t.Helper()
	return resumeAs(t, s, k, false)
}

// resumeAs resumes k, negotiated or manual.
func resumeAs(t *testing.T, s *Store, k crypto.Fingerprint, negotiated bool) uint64 {
	t.Helper()
	v, err := s.Resume(k, negotiated)
	if err != nil {
		t.Fatalf("Resume: %v", err)
	}
	return v
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// stateDir returns a fresh state directory (not yet created: Open makes
// it).
func stateDir(t *testing.T) string { return filepath.Join(t.TempDir(), "state") }

func TestReopenKeepsValues(t *testing.T) {
	dir := stateDir(t)
	s := open(t, dir, Options{})
	if v := resume(t, s, fp(1)); v != 0 {
		t.Fatalf("fresh store: Resume = %d, want 0", v)
	}
	must(t, s.Reserve(fp(1), 1<<20))
	must(t, s.Reserve(fp(1), 2<<20))
	must(t, s.Reserve(fp(1), 1<<20)) // lower: no effect
	must(t, s.Retire(fp(1), 1<<20+77))
	resume(t, s, fp(2))
	must(t, s.Reserve(fp(2), 1<<20))
	must(t, s.Close())
	if _, err := s.Resume(fp(1), false); !errors.Is(err, ErrClosed) {
		t.Errorf("Resume after Close: %v, want ErrClosed", err)
	}

	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Errorf("created state directory has mode %04o, want 0700", fi.Mode().Perm())
	}
	s = open(t, dir, Options{})
	defer s.Close()
	// A clean retirement continues exactly after the last number sent.
	if v := resume(t, s, fp(1)); v != 1<<20+77 {
		t.Errorf("retired key: Resume = %d, want %d", v, 1<<20+77)
	}
	// A key never retired continues above its reservation.
	if v := resume(t, s, fp(2)); v != 1<<20 {
		t.Errorf("key in use: Resume = %d, want %d", v, 1<<20)
	}
	if v := resume(t, s, fp(3)); v != 0 {
		t.Errorf("unknown key: Resume = %d, want 0", v)
	}
	b, err := os.ReadFile(filepath.Join(dir, LogName))
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 2; i++ {
		k := fp(i)
		if !bytes.Contains(b, k[:]) {
			t.Errorf("log does not hold the fingerprint of key %d", i)
		}
		if bytes.Contains(b, []byte(fmt.Sprintf("key %d", i))) {
			t.Errorf("log holds key %d itself", i)
		}
	}
}

// A crash (no Retire) leaves the last reservation: the key continues above
// it, never below anything that may have been sent.
func TestCrashResumesAtReservation(t *testing.T) {
	dir := stateDir(t)
	s := open(t, dir, Options{})
	resume(t, s, fp(1))
	must(t, s.Reserve(fp(1), 1<<20))
	must(t, s.Reserve(fp(1), 2<<20))
	// What a killed process leaves: the files, nothing more written.
	crash(s)

	s = open(t, dir, Options{})
	defer s.Close()
	if v := resume(t, s, fp(1)); v != 2<<20 {
		t.Fatalf("after crash: Resume = %d, want the reservation %d", v, 2<<20)
	}
}

// TestSIGKILLDuringReserve kills a process that reserves as fast as it
// can and checks that the store, reopened, is at or above every
// reservation the process had been told was durable.
func TestSIGKILLDuringReserve(t *testing.T) {
	if dir := os.Getenv("SEQSTORE_CHILD_DIR"); dir != "" {
		s, err := Open(dir, Options{minCompact: 64})
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		base := resume(t, s, fp(1))
		for i := uint64(1); i < 1<<20; i++ {
			if err := s.Reserve(fp(1), base+i<<20); err != nil {
				fmt.Println("error", err)
				os.Exit(1)
			}
			fmt.Println(base + i<<20)
		}
		os.Exit(0)
	}
	dir := stateDir(t)
	for round := range 3 {
		acked := runAndKill(t, dir, 200+round*150)
		s := open(t, dir, Options{})
		v := resume(t, s, fp(1))
		must(t, s.Close())
		if v < acked {
			t.Fatalf("round %d: Resume = %d below the acknowledged reservation %d", round, v, acked)
		}
		t.Logf("round %d: killed after reservation %d was acknowledged; Resume %d", round, acked, v)
	}
}

// runAndKill runs TestSIGKILLDuringReserve's child on dir, SIGKILLs it
// after n acknowledged reservations and returns the last one it saw.
func runAndKill(t *testing.T, dir string, n int) uint64 {
	t.Helper()
	cmd := newChild(t, dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var last uint64
	lines := readLines(out)
	deadline := time.After(60 * time.Second)
	for i := 0; i < n; {
		select {
		case l, ok := <-lines:
			if !ok {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("child ended after %d reservations", i)
			}
			if strings.HasPrefix(l, "error") {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("child: %s", l)
			}
			if _, err := fmt.Sscan(l, &last); err != nil {
				t.Fatalf("child said %q", l)
			}
			i++
		case <-deadline:
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatal("child too slow")
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	for range lines { // what it printed before it died
	}
	return last
}

// Torn last records (a crash during the write) are ignored, and the store
// works on after them.
func TestTornTailIgnored(t *testing.T) {
	for _, tc := range []struct {
		name string
		tail func(valid []byte) []byte
	}{
		{"partial record", func(v []byte) []byte { return v[:recordSize/2] }},
		{"zeroed record", func([]byte) []byte { return make([]byte, recordSize) }},
		{"bad checksum", func(v []byte) []byte { b := bytes.Clone(v); b[9] ^= 0x40; return b }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := stateDir(t)
			s := open(t, dir, Options{})
			resume(t, s, fp(1))
			must(t, s.Reserve(fp(1), 1<<20))
			must(t, s.Close())
			path := filepath.Join(dir, LogName)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			// The record a crash interrupted: a reservation for 9<<20.
			var rec [recordSize]byte
			(&record{kind: kindReserve, value: 9 << 20, fp: fp(1)}).put(&rec)
			must(t, os.WriteFile(path, append(b, tc.tail(rec[:])...), 0o600))

			s = open(t, dir, Options{})
			if v := resume(t, s, fp(1)); v != 1<<20 {
				t.Errorf("Resume = %d, want %d (the torn record ignored)", v, 1<<20)
			}
			must(t, s.Reserve(fp(1), 3<<20))
			must(t, s.Close())
			s = open(t, dir, Options{})
			defer s.Close()
			if v := resume(t, s, fp(1)); v != 3<<20 {
				t.Errorf("after reserving past the torn record: Resume = %d, want %d", v, 3<<20)
			}
		})
	}
}

// A bad record that is not the last, or a bad header, makes the file
// corrupt: Open refuses it, says where and why it matters, and leaves it
// alone.
func TestCorruptionRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		offset int64 // of the damaged byte's record
		byteAt int64
	}{
		{"header", 0, 3},
		{"middle record checksum", 2 * recordSize, 2*recordSize + 62},
		{"middle record value", recordSize, recordSize + 12},
		{"middle record kind", 3 * recordSize, 3 * recordSize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, b := filledDir(t)
			path := filepath.Join(dir, LogName)
			b[tc.byteAt] ^= 0x01
			must(t, os.WriteFile(path, b, 0o600))

			_, err := Open(dir, Options{})
			var ce *CorruptError
			if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open of a damaged log: %v, want a CorruptError", err)
			}
			if ce.Offset != tc.offset || ce.Path != path {
				t.Errorf("error names %s offset %d, want %s offset %d", ce.Path, ce.Offset, path, tc.offset)
			}
			msg := err.Error()
			for _, want := range []string{path, fmt.Sprintf("offset %d", tc.offset), "outbound SAs cannot be trusted"} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not say %q", msg, want)
				}
			}
			after, err := os.ReadFile(path)
			if err != nil || !bytes.Equal(after, b) {
				t.Errorf("Open changed the damaged file (%v)", err)
			}
			// The lock is released: the operator's fix (moving the log
			// and its witness aside) can reopen it.
			must(t, os.Remove(path))
			must(t, os.Remove(filepath.Join(dir, HeadName)))
			open(t, dir, Options{}).Close()
		})
	}
	t.Run("empty file", func(t *testing.T) {
		dir := stateDir(t)
		open(t, dir, Options{}).Close()
		must(t, os.WriteFile(filepath.Join(dir, LogName), nil, 0o600))
		if _, err := Open(dir, Options{}); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Open of an empty log: %v, want ErrCorrupt", err)
		}
	})
}

// Compaction (while open, and at Open) keeps the newest value of every
// key and bounds the file.
func TestCompactionKeepsValues(t *testing.T) {
	dir := stateDir(t)
	const keys, rounds = 10, 100
	s := open(t, dir, Options{minCompact: 32})
	for k := range keys {
		resume(t, s, fp(k))
	}
	for r := 1; r <= rounds; r++ {
		for k := range keys {
			must(t, s.Reserve(fp(k), uint64(r*1000+k)))
		}
	}
	for k := range keys / 2 {
		must(t, s.Retire(fp(k), uint64((rounds-1)*1000+k)))
	}
	must(t, s.Close())
	if s.compactCount < 10 {
		t.Errorf("%d compactions for %d records", s.compactCount, keys*rounds)
	}
	fi, err := os.Stat(filepath.Join(dir, LogName))
	if err != nil {
		t.Fatal(err)
	}
	if max := int64(recordSize * (1 + 32 + 2*keys)); fi.Size() > max {
		t.Errorf("log of %d bytes after compactions, want at most %d", fi.Size(), max)
	}
	s = open(t, dir, Options{})
	defer s.Close()
	if s.records != keys {
		t.Errorf("log compacted at Open holds %d records, want %d", s.records, keys)
	}
	for k := range keys {
		want := uint64(rounds*1000 + k)
		if k < keys/2 {
			want = uint64((rounds-1)*1000 + k)
		}
		if v := resume(t, s, fp(k)); v != want {
			t.Errorf("key %d: Resume = %d, want %d", k, v, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, tmpName)); err == nil {
		t.Errorf("compaction left %s behind", tmpName)
	}
}

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

// Two states with the same key: a retirement never goes below what the
// other may send, in either order.
func TestSharedKey(t *testing.T) {
	for _, order := range []string{"first retires first", "second retires first"} {
		t.Run(order, func(t *testing.T) {
			s := open(t, stateDir(t), Options{})
			defer s.Close()
			k := fp(1)
			a := resume(t, s, k) // state A
			must(t, s.Reserve(k, a+1<<20))
			b := resume(t, s, k) // state B continues above A's block
			must(t, s.Reserve(k, b+1<<20))
			aLast, bLast := uint64(500), b+10
			if order == "first retires first" {
				must(t, s.Retire(k, aLast))
				if v := s.entries[k].value; v != b+1<<20 {
					t.Fatalf("A retired while B runs: mark %d, want B's reservation %d", v, b+1<<20)
				}
				must(t, s.Retire(k, bLast))
			} else {
				must(t, s.Retire(k, bLast))
				must(t, s.Retire(k, aLast))
			}
			v := resume(t, s, k)
			if v != bLast {
				t.Errorf("Resume = %d, want the highest sent, %d", v, bLast)
			}
		})
	}
}

// A Retire without a Resume in this process never lowers the mark.
func TestRetireWithoutResume(t *testing.T) {
	dir := stateDir(t)
	s := open(t, dir, Options{})
	resume(t, s, fp(1))
	must(t, s.Reserve(fp(1), 1<<20))
	must(t, s.Close())
	s = open(t, dir, Options{})
	defer s.Close()
	must(t, s.Retire(fp(1), 7))
	if v := resume(t, s, fp(1)); v != 1<<20 {
		t.Errorf("Resume = %d, want %d", v, 1<<20)
	}
}

func TestLock(t *testing.T) {
	dir := stateDir(t)
	s := open(t, dir, Options{})
	_, err := Open(dir, Options{})
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open: %v, want ErrLocked", err)
	}
	want := fmt.Sprintf("state directory %s is in use by another espd (pid %d)", dir, os.Getpid())
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error %q, want it to say %q", err, want)
	}
	must(t, s.Close())
	s = open(t, dir, Options{})
	must(t, s.Close())
}

func TestDirectoryChecks(t *testing.T) {
	dir := t.TempDir()
	must(t, os.Chmod(dir, 0o777))
	_, err := Open(dir, Options{})
	if err == nil || !strings.Contains(err.Error(), "chmod go-w") {
		t.Errorf("world-writable directory: %v, want a refusal", err)
	}
	must(t, os.Chmod(dir, 0o770))
	if _, err := Open(dir, Options{}); err == nil {
		t.Error("group-writable directory accepted")
	}
	file := filepath.Join(t.TempDir(), "f")
	must(t, os.WriteFile(file, nil, 0o600))
	if _, err := Open(file, Options{}); err == nil {
		t.Error("a file accepted as state directory")
	}
	if _, err := Open("", Options{}); err == nil {
		t.Error("empty path accepted")
	}
	if os.Geteuid() == 0 {
		must(t, os.Chmod(dir, 0o700))
		must(t, os.Chown(dir, 65534, 65534))
		if _, err := Open(dir, Options{}); err == nil || !strings.Contains(err.Error(), "owned by uid 65534") {
			t.Errorf("directory of another user: %v, want a refusal", err)
		}
	}
}

// Concurrent states, with compactions running under them; run with -race.
func TestConcurrent(t *testing.T) {
	dir := stateDir(t)
	s := open(t, dir, Options{minCompact: 16})
	const workers, rounds = 8, 60
	var wg sync.WaitGroup
	errc := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				k := fp(w*1000 + r%5)
				base, err := s.Resume(k, false)
				if err != nil {
					errc <- err
					return
				}
				if err := s.Reserve(k, base+1<<20); err != nil {
					errc <- err
					return
				}
				if err := s.Reserve(k, base+2<<20); err != nil {
					errc <- err
					return
				}
				// The shared key: every worker holds it for a round.
				sb, err := s.Resume(fp(-1), false)
				if err != nil {
					errc <- err
					return
				}
				if err := s.Reserve(fp(-1), sb+100); err != nil {
					errc <- err
					return
				}
				if err := s.Retire(fp(-1), sb+1+uint64(w)); err != nil {
					errc <- err
					return
				}
				if err := s.Retire(k, base+uint64(r)+1); err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	must(t, s.Close())
	if s.compactCount < 2 {
		t.Errorf("only %d compactions ran", s.compactCount)
	}
	s = open(t, dir, Options{})
	defer s.Close()
	for w := range workers {
		for j := range 5 {
			k := fp(w*1000 + j)
			v := resume(t, s, k)
			// Each key's Resume grew by exactly what it sent.
			var want uint64
			for r := j; r < rounds; r += 5 {
				want += uint64(r) + 1
			}
			if v != want {
				t.Errorf("worker %d key %d: Resume = %d, want %d", w, j, v, want)
			}
		}
	}
	if v := resume(t, s, fp(-1)); v == 0 {
		t.Error("shared key lost")
	}
}

// newChild returns the command that runs TestSIGKILLDuringReserve's child
// on dir.
func newChild(t *testing.T, dir string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestSIGKILLDuringReserve$")
	cmd.Env = append(os.Environ(), "SEQSTORE_CHILD_DIR="+dir)
	cmd.Stderr = os.Stderr
	return cmd
}

// readLines delivers r's lines until it ends.
func readLines(r io.Reader) <-chan string {
	c := make(chan string, 64)
	go func() {
		defer close(c)
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			c <- sc.Text()
		}
	}()
	return c
}
