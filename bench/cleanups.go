package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/espd/espd/testbed"
)

// cleanups runs teardown functions once, newest first, from the normal
// exit path or from the signal handler, whichever comes first.
type cleanups struct {
	mu   sync.Mutex
	fns  []func()
	done bool
}

func (c *cleanups) add(fn func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fns = append(c.fns, fn)
}

func (c *cleanups) run() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return
	}
	c.done = true
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
}

// prepare checks that namespaces work here, arranges that Ctrl-C (and
// SIGTERM, SIGHUP) cancels the returned context and runs the cleanups
// (saying what it does: doing), and removes the namespaces a killed run
// left. The caller defers done, which runs the cleanups too.
func prepare(ctx context.Context, stderr io.Writer, doing string) (context.Context, *cleanups, func(), error) {
	if err := testbed.Available(); err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	cl := &cleanups{}
	restore := testbed.HandleSignals(func(sig os.Signal) {
		fmt.Fprintf(stderr, "\nbench: %v: %s\n", sig, doing)
		cancel()
		cl.run()
	})
	done := func() {
		restore()
		cl.run()
		cancel()
	}
	if removed, err := testbed.RemoveStale(namespacePrefix); err != nil {
		done()
		return nil, nil, nil, err
	} else if len(removed) > 0 {
		fmt.Fprintf(stderr, "bench: removed %d namespaces left by a killed run\n", len(removed))
	}
	return ctx, cl, done, nil
}
