package main

import (
	"context"
	"io"
	"time"

	"github.com/espd/espd/control"
	"github.com/espd/espd/control/wire"
)

// show writes one result to stdout: its JSON view with --json, else the
// text that print makes of it.
func show[T, J any](a *app, v T, view func(T) J, print func(io.Writer, T)) error {
	if a.json {
		return writeJSON(a.stdout, view(v))
	}
	print(a.stdout, v)
	return nil
}

// query runs one request, ask, and shows its answer.
func query[T, J any](a *app, ctx context.Context, ask func(*control.Client, context.Context) (T, error),
	view func(T) J, print func(io.Writer, T)) error {
	return a.request(ctx, func(ctx context.Context, c *control.Client) error {
		v, err := ask(c, ctx)
		if err != nil {
			return err
		}
		return show(a, v, view, print)
	})
}

// listCmd runs a command that lists objects (sa list, policy list): it
// takes no flags but --json and shows the objects that list fetches, with
// --json as one array (empty rather than null when there are none).
func listCmd[T, J any](a *app, ctx context.Context, name string, args []string,
	list func(*control.Client, context.Context) ([]T, error), view func(T) J, print func(io.Writer, T)) error {
	if err := a.noFlags(name, args); err != nil {
		return err
	}
	views := func(items []T) []J {
		vs := make([]J, 0, len(items))
		for _, it := range items {
			vs = append(vs, view(it))
		}
		return vs
	}
	printAll := func(w io.Writer, items []T) {
		for _, it := range items {
			print(w, it)
		}
	}
	return query(a, ctx, list, views, printAll)
}

// saPrinter returns a printer of states that gives their ages as of its
// first call, so that a list is printed as of one moment.
func saPrinter() func(io.Writer, wire.SAInfo) {
	var now time.Time
	return func(w io.Writer, in wire.SAInfo) {
		if now.IsZero() {
			now = time.Now()
		}
		printSA(w, in, now)
	}
}
