package daemon

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/control"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/seqstore"
	"github.com/espd/espd/testbed"
)

func TestOpenSeqStore(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	fp := crypto.KeyFingerprint([]byte("0123456789abcdef0123"), nil)

	t.Run("memory", func(t *testing.T) {
		st, closeSeq, err := openSeqStore("", log)
		if err != nil || st != nil {
			t.Fatalf("no state directory: store %v, err %v; want none (sa's in-memory default)", st, err)
		}
		if err := closeSeq(); err != nil {
			t.Error(err)
		}
	})

	dir := filepath.Join(t.TempDir(), "state")
	t.Run("durable", func(t *testing.T) {
		st, closeSeq, err := openSeqStore(dir, log)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := st.(*seqstore.Store); !ok {
			t.Fatalf("store %T, want *seqstore.Store", st)
		}
		// A second espd on the same directory does not start.
		if _, _, err := openSeqStore(dir, log); !errors.Is(err, seqstore.ErrLocked) {
			t.Errorf("second open: %v, want ErrLocked", err)
		}
		if _, err := st.Resume(fp, false); err != nil {
			t.Fatal(err)
		}
		if err := st.Reserve(fp, 1<<20); err != nil {
			t.Fatal(err)
		}
		if err := st.Retire(fp, 5); err != nil {
			t.Fatal(err)
		}
		if err := closeSeq(); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("corrupt", func(t *testing.T) {
		path := filepath.Join(dir, seqstore.LogName)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, b[64:128]...) // a record after ...
		b[64+9] ^= 1                // ... a damaged one
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		logs.Reset()
		st, closeSeq, err := openSeqStore(dir, log)
		if err != nil {
			t.Fatalf("corrupt store: %v; want espd to start and refuse outbound states", err)
		}
		defer closeSeq()
		_, err = st.Resume(fp, false)
		if !errors.Is(err, seqstore.ErrCorrupt) || !strings.Contains(err.Error(), path) {
			t.Errorf("Resume: %v, want the corruption of %s", err, path)
		}
		if l := logs.String(); !strings.Contains(l, "level=ERROR") || !strings.Contains(l, "REFUSING EVERY OUTBOUND SA") {
			t.Errorf("not logged loudly:\n%s", l)
		}
	})
}

// TestDaemonClosesSeqStore runs a daemon with a state directory and stops
// it: the store is closed (its lock released) when Run returns.
func TestDaemonClosesSeqStore(t *testing.T) {
	ns := testbed.NewNodeT(t, "seq")
	tmp := t.TempDir()
	state := filepath.Join(tmp, "state")
	d, err := New(Options{
		Dataplane: dataplane.Config{Keepalive: -1},
		Control:   control.ServerConfig{Path: filepath.Join(tmp, "espd.sock")},
		StateDir:  state,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := seqstore.Open(state, seqstore.Options{}); !errors.Is(err, seqstore.ErrLocked) {
		t.Fatalf("state directory of a daemon opened again: %v, want ErrLocked", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ns.Do(func() error { return d.Run(ctx, nil) }) }()
	time.Sleep(200 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("daemon did not stop")
	}
	st, err := seqstore.Open(state, seqstore.Options{})
	if err != nil {
		t.Fatalf("after the daemon stopped: %v", err)
	}
	st.Close()
}
