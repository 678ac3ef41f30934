package seqstore

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// crash leaves the store as a killed process would: its files as they
// are, nothing more written.
func crash(s *Store) {
	s.wg.Wait()
	for _, f := range []*os.File{s.f, s.head} {
		if f != nil {
			f.Close()
		}
	}
	s.lock.Close()
}

// filledDir returns a state directory whose log holds a header and five
// reservations (keys 0-4, 1<<20 each), all acknowledged, and the log's
// bytes.
func filledDir(t *testing.T) (string, []byte) {
	t.Helper()
	dir := stateDir(t)
	clk := &fakeClock{t: time.Unix(1e9, 0)} // no clock record at Close
	s := open(t, dir, Options{now: clk.now})
	for i := range 5 {
		resume(t, s, fp(i))
		must(t, s.Reserve(fp(i), 1<<20))
	}
	must(t, s.Close())
	b, err := os.ReadFile(filepath.Join(dir, LogName))
	must(t, err)
	if len(b) != 6*recordSize {
		t.Fatalf("log of %d bytes, want %d", len(b), 6*recordSize)
	}
	return dir, b
}

// Damage to what was acknowledged (the log cut short at a record
// boundary, down to its header or to nothing, an acknowledged record
// changed, the witness gone or spoilt) is refused with an error that
// names the file and the reason: never taken for a torn write.
func TestDamageRefused(t *testing.T) {
	swap := func(b []byte) []byte {
		// A valid record (right checksum) in place of the last one.
		var r [recordSize]byte
		(&record{kind: kindReserve, value: 1, fp: fp(4)}).put(&r)
		return append(bytes.Clone(b[:5*recordSize]), r[:]...)
	}
	flip := func(at int) func([]byte) []byte {
		return func(b []byte) []byte { b = bytes.Clone(b); b[at] ^= 0x01; return b }
	}
	for _, tc := range []struct {
		name   string
		log    func([]byte) []byte // nil: remove the log
		head   func(dir string)    // damage to the witness
		file   string              // the file the error names
		offset int64
		reason string
	}{
		{name: "truncated at a record boundary", log: func(b []byte) []byte { return b[:5*recordSize] }, file: LogName, offset: 5 * recordSize, reason: "truncated: it holds 5 records, its witness"},
		{name: "truncated to its header", log: func(b []byte) []byte { return b[:recordSize] }, file: LogName, offset: recordSize, reason: "truncated: it holds 1 records"},
		{name: "truncated to nothing", log: func([]byte) []byte { return nil }, file: LogName, reason: "empty file, but its witness"},
		{name: "truncated inside the last record", log: func(b []byte) []byte { return b[:len(b)-10] }, file: LogName, offset: 5 * recordSize, reason: "short record"},
		{name: "removed", log: nil, file: LogName, reason: "the log is missing, but its witness"},
		{name: "last acknowledged record flipped", log: flip(5*recordSize + 12), file: LogName, offset: 5 * recordSize, reason: "bad checksum, in a record its witness"},
		{name: "middle record flipped", log: flip(2*recordSize + 12), file: LogName, offset: 2 * recordSize, reason: "bad checksum"},
		{name: "last record replaced by a valid one", log: swap, file: LogName, reason: "its records differ from those its witness"},
		{name: "witness removed", head: func(dir string) { must(t, os.Remove(filepath.Join(dir, HeadName))) }, file: LogName, reason: "witness " + "%s" + " is missing"},
		{name: "witness spoilt", head: func(dir string) {
			p := filepath.Join(dir, HeadName)
			b, err := os.ReadFile(p)
			must(t, err)
			b[20] ^= 1
			b[headSlot+20] ^= 1
			must(t, os.WriteFile(p, b, 0o600))
		}, file: HeadName, reason: "witness unreadable (bad checksum)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, b := filledDir(t)
			path := filepath.Join(dir, LogName)
			switch {
			case tc.head != nil:
				tc.head(dir)
			case tc.log == nil:
				must(t, os.Remove(path))
			default:
				must(t, os.WriteFile(path, tc.log(b), 0o600))
			}
			before, _ := os.ReadFile(path)
			s, err := Open(dir, Options{})
			if err == nil {
				v := resume(t, s, fp(4))
				s.Close()
				t.Fatalf("Open accepted the damaged store; key 4 would resume at %d, below its acknowledged 1<<20", v)
			}
			var ce *CorruptError
			if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open: %v, want a CorruptError", err)
			}
			want := filepath.Join(dir, tc.file)
			reason := tc.reason
			if strings.Contains(reason, "%s") {
				reason = fmt.Sprintf(reason, filepath.Join(dir, HeadName))
			}
			if ce.Path != want || ce.Offset != tc.offset || !strings.Contains(ce.Reason, reason) {
				t.Errorf("error names %s offset %d (%s), want %s offset %d (%s)", ce.Path, ce.Offset, ce.Reason, want, tc.offset, reason)
			}
			if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "outbound SAs cannot be trusted") {
				t.Errorf("error %q does not name %s and the consequence", err, want)
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(after, before) {
				t.Error("Open changed the damaged log")
			}
		})
	}
}

// What a crash leaves is accepted: a record beyond what the witness
// acknowledges (a crash between its fsync and the witness's) is read if
// it is whole and valid, and ignored if not; a witness slot torn by a
// crash leaves the previous one.
func TestCrashBeyondWitness(t *testing.T) {
	t.Run("valid record beyond", func(t *testing.T) {
		dir, b := filledDir(t)
		var r [recordSize]byte
		(&record{kind: kindReserve, value: 7 << 20, fp: fp(1)}).put(&r)
		must(t, os.WriteFile(filepath.Join(dir, LogName), append(b, r[:]...), 0o600))
		s := open(t, dir, Options{})
		defer s.Close()
		if v := resume(t, s, fp(1)); v != 7<<20 {
			t.Errorf("Resume = %d, want %d (the whole record beyond the witness read)", v, 7<<20)
		}
	})
	t.Run("torn witness slot", func(t *testing.T) {
		dir, _ := filledDir(t)
		s := open(t, dir, Options{})
		resume(t, s, fp(1))
		must(t, s.Reserve(fp(1), 3<<20)) // its slot is then torn
		gen := s.gen
		crash(s)
		p := filepath.Join(dir, HeadName)
		b, err := os.ReadFile(p)
		must(t, err)
		b[int(gen%2)*headSlot+30] ^= 0xff
		must(t, os.WriteFile(p, b, 0o600))
		s = open(t, dir, Options{})
		defer s.Close()
		if v := resume(t, s, fp(1)); v != 3<<20 {
			t.Errorf("Resume = %d, want %d", v, 3<<20)
		}
	})
}

// A crash at each step of a compaction (while open, at the Open of a
// new directory, at the Open that upgrades a version 1 log) leaves a
// store that opens with every value.
func TestCompactionCrash(t *testing.T) {
	for _, step := range []string{"copied", "witnessed", "renamed"} {
		crashAt := func(s string) error {
			if s == step {
				return errors.New("crash")
			}
			return nil
		}
		t.Run("open/"+step, func(t *testing.T) {
			dir, _ := filledDir(t)
			o := Options{}
			s := open(t, dir, o)
			resume(t, s, fp(1))
			must(t, s.Reserve(fp(1), 5<<20))
			s.opts.compactHook = crashAt
			s.mu.Lock()
			err := s.compactLocked()
			s.mu.Unlock()
			if err == nil {
				t.Fatal("compaction did not stop at the step")
			}
			crash(s)
			checkValues(t, dir, map[int]uint64{0: 1 << 20, 1: 5 << 20, 4: 1 << 20})
		})
		t.Run("new/"+step, func(t *testing.T) {
			dir := stateDir(t)
			if _, err := Open(dir, Options{compactHook: crashAt}); err == nil {
				t.Fatal("Open did not stop at the step")
			}
			checkValues(t, dir, map[int]uint64{1: 0})
		})
		t.Run("upgrade/"+step, func(t *testing.T) {
			dir := v1Dir(t)
			if _, err := Open(dir, Options{compactHook: crashAt}); err == nil {
				t.Fatal("Open did not stop at the step")
			}
			checkValues(t, dir, map[int]uint64{1: 77, 3: 1 << 21})
		})
	}
}

// checkValues opens dir twice (with writes in between) and checks that
// each key resumes at its value.
func checkValues(t *testing.T, dir string, want map[int]uint64) {
	t.Helper()
	for range 2 {
		s := open(t, dir, Options{})
		for k, w := range want {
			if v := resume(t, s, fp(k)); v != w {
				t.Errorf("key %d: Resume = %d, want %d", k, v, w)
			}
			must(t, s.Retire(fp(k), w))
		}
		resume(t, s, fp(99))
		must(t, s.Reserve(fp(99), 1<<20))
		must(t, s.Close())
	}
}

// v1Dir returns a state directory with a version 1 log (no witness).
func v1Dir(t *testing.T) string {
	t.Helper()
	dir := stateDir(t)
	must(t, os.MkdirAll(dir, 0o700))
	var buf bytes.Buffer
	var b [recordSize]byte
	put := func(r record) { r.put(&b); buf.Write(b[:]) }
	put(record{kind: kindHeader, value: formatV1, fp: magic})
	put(record{kind: kindReserve, value: 1 << 20, clock: 10, fp: fp(1)})
	put(record{kind: kindRetire, value: 77, clock: 20, fp: fp(1)})
	put(record{kind: kindReserve, value: 1 << 21, clock: 40, fp: fp(3)})
	must(t, os.WriteFile(filepath.Join(dir, LogName), buf.Bytes(), 0o600))
	return dir
}

// A version 1 log is accepted once, as it is, and gets a witness and a
// version 2 header (which an espd that reads version 1 only refuses);
// from then on it is checked like any other.
func TestUpgrade(t *testing.T) {
	dir := v1Dir(t)
	s := open(t, dir, Options{})
	must(t, s.Close())
	b, err := os.ReadFile(filepath.Join(dir, LogName))
	must(t, err)
	h, err := parse(b[:recordSize])
	must(t, err)
	if h.value != formatVersion || formatVersion == formatV1 {
		t.Errorf("header version %d after the upgrade, want %d", h.value, formatVersion)
	}
	if _, err := readHead(filepath.Join(dir, HeadName)); err != nil {
		t.Fatalf("no witness after the upgrade: %v", err)
	}
	checkValues(t, dir, map[int]uint64{1: 77, 3: 1 << 21})
	must(t, os.Remove(filepath.Join(dir, HeadName)))
	if _, err := Open(dir, Options{}); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("upgraded log without its witness: %v, want ErrCorrupt", err)
	}
}

// The directory itself is locked: removing the lock file does not let a
// second store open it.
func TestLockFileRemoved(t *testing.T) {
	dir := stateDir(t)
	s := open(t, dir, Options{})
	defer s.Close()
	must(t, os.Remove(filepath.Join(dir, lockName)))
	s2, err := Open(dir, Options{})
	if err == nil {
		s2.Close()
		t.Fatal("a second store opened the directory after its lock file was removed")
	}
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "state directory "+dir+" is in use") {
		t.Errorf("second Open: %v, want ErrLocked naming %s", err, dir)
	}
}
