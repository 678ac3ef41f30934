package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/espd/espd/control"
	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/sa"
)

// pairBackend is a node of a gateway pair: node 2, no role until told.
type pairBackend struct {
	dbBackend
	mu    *sync.Mutex
	st    *wire.PairStatus
	calls *[]wire.PairRole
}

func (b pairBackend) PairRole(role wire.PairRole) (wire.PairStatus, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	*b.calls = append(*b.calls, role)
	switch role {
	case wire.PairRoleActive:
		b.st.Role, b.st.Released, b.st.Silent = role, 3, 1
	case wire.PairRoleStandby:
		b.st.Role, b.st.Released, b.st.Silent = role, 0, 0
	}
	return *b.st, nil
}

// TestPairCommands runs pair status and pair role against a node of a
// pair, in text and JSON, and against an espd that is not in one.
func TestPairCommands(t *testing.T) {
	var calls []wire.PairRole
	b := pairBackend{mu: new(sync.Mutex), st: &wire.PairStatus{Node: 2}, calls: &calls}
	d := startDaemonWith(t, func(db *sa.DB) control.Backend { b.dbBackend = dbBackend{db}; return b })

	if out, _ := d.espctl(t, 0, "pair", "status"); out != "node 2 role none released 0 silent 0 peer-heard never\n" {
		t.Fatalf("pair status: %q", out)
	}
	if out, _ := d.espctl(t, 0, "pair", "role", "active"); out != "node 2 role active released 3 silent 1 peer-heard never\n" {
		t.Fatalf("pair role active: %q", out)
	}
	b.mu.Lock()
	b.st.PeerHeardMs = 120
	b.mu.Unlock()
	if out, _ := d.espctl(t, 0, "pair", "status"); out != "node 2 role active released 3 silent 1 peer-heard 120ms\n" {
		t.Fatalf("pair status after active: %q", out)
	}

	// --json, before or after the command.
	for _, args := range [][]string{{"--json", "pair", "role", "standby"}, {"pair", "role", "standby", "--json"}, {"pair", "role", "--json", "standby"}} {
		out, _ := d.espctl(t, 0, args...)
		var got map[string]any
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("%q: %v\n%s", args, err, out)
		}
		if got["node"] != float64(2) || got["role"] != "standby" || got["released"] != float64(0) || got["silent"] != float64(0) ||
			got["peer_heard_ms"] != float64(120) {
			t.Fatalf("%q: %s", args, out)
		}
	}
	b.mu.Lock()
	b.st.PeerHeardMs = 0
	b.mu.Unlock()
	out, _ := d.espctl(t, 0, "pair", "status", "--json")
	if strings.TrimSpace(out) != `{"node":2,"role":"standby","released":0,"silent":0,"peer_heard_ms":null}` {
		t.Fatalf("pair status --json: %s", out)
	}
	b.mu.Lock()
	got := calls
	b.mu.Unlock()
	want := []wire.PairRole{wire.PairRoleNone, wire.PairRoleActive, wire.PairRoleNone,
		wire.PairRoleStandby, wire.PairRoleStandby, wire.PairRoleStandby, wire.PairRoleNone}
	if len(got) != len(want) {
		t.Fatalf("roles sent %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("roles sent %v, want %v", got, want)
		}
	}

	// An espd that is not one of a pair: the request fails, exit 1.
	plain := startDaemon(t)
	for _, args := range [][]string{{"pair", "status"}, {"pair", "role", "active"}} {
		out, stderr := plain.espctl(t, exitError, args...)
		if out != "" || !strings.Contains(stderr, "espctl: "+strings.Join(args[:2], " ")+": ") ||
			!strings.Contains(stderr, "not one of a gateway pair (EOPNOTSUPP)") {
			t.Fatalf("%q without a pair: stdout %q, stderr %q", args, out, stderr)
		}
	}
}

func TestPrintPair(t *testing.T) {
	for _, c := range []struct {
		st   wire.PairStatus
		want string
	}{
		{wire.PairStatus{Node: 1, Role: wire.PairRoleActive, Released: 3, PeerHeardMs: 120}, "node 1 role active released 3 silent 0 peer-heard 120ms\n"},
		{wire.PairStatus{Node: 2, Role: wire.PairRoleStandby, Silent: 4}, "node 2 role standby released 0 silent 4 peer-heard never\n"},
		{wire.PairStatus{Node: 1, PeerHeardMs: 61500}, "node 1 role none released 0 silent 0 peer-heard 1m1.5s\n"},
		{wire.PairStatus{Node: 1, PeerHeardMs: 1<<64 - 1}, "node 1 role none released 0 silent 0 peer-heard 18446744073709551615ms\n"},
	} {
		var b bytes.Buffer
		printPair(&b, c.st)
		if b.String() != c.want {
			t.Errorf("%+v: %q, want %q", c.st, b.String(), c.want)
		}
	}
}

// TestPairUsage: the usage text lists the pair commands, and pair role -h
// names its argument.
func TestPairUsage(t *testing.T) {
	if !strings.Contains(usage, "pair role   active|standby") || !strings.Contains(usage, "pair status") {
		t.Fatalf("usage lacks the pair commands:\n%s", usage)
	}
	var out, errb bytes.Buffer
	if code := run(t.Context(), []string{"pair", "role", "-h"}, nil, &out, &errb); code != exitOK ||
		!strings.Contains(errb.String(), "usage: espctl pair role active|standby") {
		t.Fatalf("pair role -h: exit %d, %q", code, errb.String())
	}
}
