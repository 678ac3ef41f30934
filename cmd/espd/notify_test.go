package main

import (
	"bytes"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/daemon"
)

// TestSystemdNotifier sends the daemon's states to a NOTIFY_SOCKET the test
// listens on, as systemd does for a Type=notify unit, and checks that each
// arrives as one datagram, unchanged.
func TestSystemdNotifier(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	ln, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	t.Setenv("NOTIFY_SOCKET", path)
	var logs bytes.Buffer
	notify := systemdNotifier(slog.New(slog.NewTextHandler(&logs, nil)))
	buf := make([]byte, 512)
	for _, state := range []string{daemon.NotifyReady, daemon.NotifyReloading + "\nMONOTONIC_USEC=123", daemon.NotifyStopping} {
		notify(state)
		ln.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := ln.Read(buf)
		if err != nil {
			t.Fatalf("%q: %v", state, err)
		}
		if got := string(buf[:n]); got != state {
			t.Errorf("received %q, sent %q", got, state)
		}
	}
	if logs.Len() > 0 {
		t.Errorf("logged %q", logs.String())
	}
}

// TestSystemdNotifierFailures: without NOTIFY_SOCKET (espd not started by
// systemd) nothing is sent or logged; with a socket nobody listens on, the
// first failure is a warning and later ones are not.
func TestSystemdNotifierFailures(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	t.Setenv("NOTIFY_SOCKET", "")
	systemdNotifier(log)(daemon.NotifyReady)
	if logs.Len() > 0 {
		t.Fatalf("without NOTIFY_SOCKET: logged %q", logs.String())
	}
	t.Setenv("NOTIFY_SOCKET", filepath.Join(t.TempDir(), "absent"))
	notify := systemdNotifier(log)
	notify(daemon.NotifyReady)
	notify(daemon.NotifyStopping)
	if got := strings.Count(logs.String(), "level=WARN"); got != 1 || !strings.Contains(logs.String(), "NOTIFY_SOCKET") {
		t.Fatalf("two failed notifications logged %d warnings, want 1 naming NOTIFY_SOCKET:\n%s", got, logs.String())
	}
}
