package ikehub

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/espd/espd/conn"
)

// syncBuffer is a bytes.Buffer safe for the logger and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestIKEAbsentWarns: when the IKE daemon's registration ends and none
// comes back, espd warns after ikeAbsentFirst, with the advice, and again
// every ikeAbsentEvery; a registration that comes back in time, or the
// hand-off stopping, silences it.
func TestIKEAbsentWarns(t *testing.T) {
	defer func(f, e time.Duration) { ikeAbsentFirst, ikeAbsentEvery = f, e }(ikeAbsentFirst, ikeAbsentEvery)
	ikeAbsentFirst, ikeAbsentEvery = 300*time.Millisecond, 200*time.Millisecond

	var buf syncBuffer
	h := &Hub{log: slog.New(slog.NewTextHandler(&buf, nil)), dropLog: conn.LogLimit{Every: time.Second}}
	register := func() *session {
		s := &session{hub: h, ch: make(chan conn.IKEPacket, 1)}
		h.mu.Lock()
		h.cur, h.registered = s, true
		h.back()
		h.mu.Unlock()
		return s
	}
	warnings := func() int { return strings.Count(buf.String(), ikeAbsentMsg) }
	poll := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 30 s; log:\n%s", what, buf.String())
			}
		}
	}

	// charon restarts: back well before the first warning would be due.
	s := register()
	s.Close()
	register()
	time.Sleep(2 * ikeAbsentFirst)
	if n := warnings(); n != 0 {
		t.Fatalf("%d warnings for a registration that came back at once:\n%s", n, buf.String())
	}

	// charon does not come back: the warning, with the advice, repeated.
	h.cur.Close()
	poll("the first warning", func() bool { return warnings() >= 1 })
	if !strings.Contains(buf.String(), "docs/upgrade.md") || !strings.Contains(buf.String(), "journalctl -u strongswan") {
		t.Errorf("the warning has no advice:\n%s", buf.String())
	}
	poll("the warning repeated", func() bool { return warnings() >= 2 })

	// It comes back: no more warnings, and espd says how long it was away.
	register()
	n := warnings()
	time.Sleep(3 * ikeAbsentEvery)
	if warnings() != n {
		t.Errorf("warnings after the IKE daemon came back:\n%s", buf.String())
	}
	if !strings.Contains(buf.String(), "IKE daemon back after a time without one") {
		t.Errorf("no line when the IKE daemon came back:\n%s", buf.String())
	}

	// The hand-off stops (espd shutting down): its own end of the
	// registration is no absence.
	h.stopAbsent()
	h.cur.Close()
	time.Sleep(2 * ikeAbsentFirst)
	if warnings() != n {
		t.Errorf("a warning after the hand-off stopped:\n%s", buf.String())
	}
}
