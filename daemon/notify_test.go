package daemon

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/control"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/testbed"
	"github.com/espd/espd/tun"
)

// TestNotify checks what Options.Notify hears and when: NotifyReady only
// once the control socket accepts connections, the TUN exists and the
// configuration file is applied; NotifyReloading (with MONOTONIC_USEC)
// and NotifyReady around a reload, a refused one too; NotifyStopping when
// the context ends.
func TestNotify(t *testing.T) {
	ns := testbed.NewNodeT(t, "notify")
	dir := t.TempDir()
	sock := filepath.Join(dir, "espd.sock")
	cfg := filepath.Join(dir, "espd.toml")
	policy := "[[policy]]\nsrc = \"198.18.1.0/24\"\ndst = \"198.18.2.0/24\"\ndir = \"out\"\naction = \"drop\"\n"
	if err := os.WriteFile(cfg, []byte(policy), 0o600); err != nil {
		t.Fatal(err)
	}
	type note struct {
		state string
		err   string // what was not ready when it came ("" if all was)
	}
	notes := make(chan note, 16)
	var d *Daemon
	notify := func(state string) {
		n := note{state: state}
		if state == NotifyReady {
			// Run waits for Notify: what holds now held when READY=1 left.
			if c, err := net.Dial("unix", sock); err != nil {
				n.err = "control socket: " + err.Error()
			} else {
				c.Close()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			if _, err := ns.IP(ctx, "link", "show", "dev", tun.DefaultName); err != nil {
				n.err += " TUN: " + err.Error()
			}
			cancel()
			if len(d.DB().Policies()) != 1 {
				n.err += " configuration not applied"
			}
		}
		notes <- n
	}
	var err error
	d, err = New(Options{
		Dataplane:  dataplane.Config{Keepalive: -1},
		Control:    control.ServerConfig{Path: sock},
		ConfigPath: cfg,
		Notify:     notify,
	})
	if err != nil {
		t.Fatal(err)
	}
	reload := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() { stopped <- ns.Do(func() error { return d.Run(ctx, reload) }) }()
	returned := false
	defer func() {
		cancel()
		if returned {
			return
		}
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Error("daemon did not stop within 10 s")
		}
	}()

	next := func(want string) note {
		t.Helper()
		select {
		case n := <-notes:
			if !strings.HasPrefix(n.state, want) {
				t.Fatalf("notified %q, want %s", n.state, want)
			}
			if n.err != "" {
				t.Fatalf("notified %s before it was ready: %s", n.state, n.err)
			}
			return n
		case err := <-stopped:
			returned = true
			t.Fatalf("Run returned %v before notifying %s", err, want)
		case <-time.After(20 * time.Second):
			t.Fatalf("not notified %s within 20 s", want)
		}
		return note{}
	}
	sighup := func() {
		t.Helper()
		select {
		case reload <- struct{}{}:
		case err := <-stopped:
			returned = true
			t.Fatalf("Run returned %v", err)
		}
	}
	next(NotifyReady)

	sighup()
	if n := next(NotifyReloading); !strings.Contains(n.state, "\nMONOTONIC_USEC=") {
		t.Errorf("reloading notification %q without MONOTONIC_USEC", n.state)
	}
	next(NotifyReady)

	// A refused file ends its reload with READY=1 too: espd runs on.
	if err := os.WriteFile(cfg, []byte("[[policy]]\nsrc = \"nonsense\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sighup()
	next(NotifyReloading)
	next(NotifyReady)

	cancel()
	next(NotifyStopping)
	select {
	case err := <-stopped:
		returned = true
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("daemon did not stop within 10 s of STOPPING=1")
	}
	select {
	case n := <-notes:
		t.Errorf("notified %q after STOPPING=1", n.state)
	default:
	}
}
