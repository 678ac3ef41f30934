package system

import (
	"context"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/testbed"
)

// Routing is the ceiling: the gateways forward in the clear.
type Routing struct {
	top *testbed.Topology
}

// Name implements System.
func (*Routing) Name() string { return "routing" }

// Label implements System.
func (*Routing) Label() string { return "routing only (ceiling)" }

// PerSuite implements System.
func (*Routing) PerSuite() bool { return false }

// Cipher implements System.
func (*Routing) Cipher() string { return "none" }

// Available implements System.
func (*Routing) Available(*Env) error { return nil }

// Setup implements System: a line with routes between the LANs.
func (r *Routing) Setup(ctx context.Context, env *Env) error {
	var err error
	r.top, err = newLine(env, true)
	return err
}

// Key implements System.
func (*Routing) Key(context.Context, crypto.Suite) error { return nil }

// Unkey implements System.
func (*Routing) Unkey(context.Context) error { return nil }

// Topology implements System.
func (r *Routing) Topology() *testbed.Topology { return r.top }

// Gateways implements System: the kernel forwards, no process does.
func (*Routing) Gateways() (a, b []int) { return nil, nil }

// Counters implements System.
func (*Routing) Counters(context.Context) (Counters, bool, error) { return Counters{}, false, nil }

// Close implements System.
func (r *Routing) Close() error {
	if r.top == nil {
		return nil
	}
	return r.top.Close()
}
