package daemon

import (
	"context"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// daemonRun is a Daemon running in a namespace for a test.
type daemonRun struct {
	stopped chan struct{} // closed when Run has returned
	err     error         // Run's result, once stopped is closed
}

// exited reports whether Run has returned, and with what.
func (r *daemonRun) exited() (bool, error) {
	select {
	case <-r.stopped:
		return true, r.err
	default:
		return false, nil
	}
}

// runIn runs d (made with New) in ns until the test ends, with reload as
// its SIGHUP channel (nil: none). The test's cleanup stops it and reports
// an error from Run, or a stop that takes more than 10 s.
func runIn(t testing.TB, ns *testbed.Node, d *Daemon, reload <-chan struct{}) *daemonRun {
	t.Helper()
	r := &daemonRun{stopped: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		r.err = ns.Do(func() error { return d.Run(ctx, reload) })
		close(r.stopped)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.stopped:
			if r.err != nil {
				t.Errorf("daemon in %s stopped with %v", ns.Role, r.err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("daemon in %s did not stop within 10 s", ns.Role)
		}
	})
	return r
}
