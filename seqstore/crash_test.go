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
	"testing"
	"time"
)

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
