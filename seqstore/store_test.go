package seqstore

import (
	"bytes"
	"errors"
	"fmt"
	"os"
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

// waitCompacted waits (bounded) until no compaction of s is under way.
func waitCompacted(t *testing.T, s *Store) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(time.Millisecond) {
		s.mu.Lock()
		busy := s.compacting
		s.mu.Unlock()
		if !busy {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("a compaction did not finish within 30 s")
		}
	}
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
			// A compaction runs in the background, and records appended
			// while its copy syncs go to the old log too: on a slow disk
			// they pile up past the bound below. Let each one finish.
			waitCompacted(t, s)
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
	if !errors.Is(err, ErrUnsafeDir) || !strings.Contains(err.Error(), "chmod go-w") {
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
		if _, err := Open(dir, Options{}); !errors.Is(err, ErrUnsafeDir) || !strings.Contains(err.Error(), "owned by uid 65534") {
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
