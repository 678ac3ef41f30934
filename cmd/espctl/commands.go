package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	"github.com/espd/espd/control"
	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/sa"
)

func saAdd(a *app, ctx context.Context, args []string) error {
	f := newSAFlags("sa add", "config")
	f.stdin = a.stdin
	if err := a.parse(f.fs, f.parse, args); err != nil {
		return err
	}
	cfg, fields, err := f.config(true)
	defer clear(cfg.EncKey)
	defer clear(cfg.IntegKey)
	if err != nil {
		return usageError{err}
	}
	// Only what was given travels: espd fills the rest with its defaults,
	// the same as for the configuration file and any other client.
	return a.request(ctx, func(ctx context.Context, c *control.Client) error {
		return c.AddSAFields(ctx, cfg, fields)
	})
}

func saUpdate(a *app, ctx context.Context, args []string) error {
	f := newSAFlags("sa update", "config", "update")
	f.stdin = a.stdin
	if err := a.parse(f.fs, f.parse, args); err != nil {
		return err
	}
	if f.set["src"] {
		return usagef("sa update: --src is not changed in place; use --new-src")
	}
	spi, id, err := f.id()
	if err != nil {
		return usageError{err}
	}
	cfg, fields, err := f.config(false)
	defer clear(cfg.EncKey)
	defer clear(cfg.IntegKey)
	if err != nil {
		return usageError{err}
	}
	if fields == 0 {
		return usagef("sa update: nothing to change")
	}
	return a.request(ctx, func(ctx context.Context, c *control.Client) error {
		// A lifetime travels whole: keep the limits not given.
		if fields&(wire.FieldSoft|wire.FieldHard) != 0 {
			cur, err := c.GetSA(ctx, spi, id.Dst)
			if err != nil {
				return err
			}
			mergeLifetime(&cfg.Soft, cur.Config.Soft, f.set, "soft")
			mergeLifetime(&cfg.Hard, cur.Config.Hard, f.set, "hard")
		}
		return c.UpdateSA(ctx, wire.SAUpdate{SPI: spi, Dst: id.Dst, Config: cfg, Fields: fields})
	})
}

// mergeLifetime fills the limits of l whose flags were not given from cur.
func mergeLifetime(l *sa.Lifetime, cur sa.Lifetime, set map[string]bool, name string) {
	if !set[name+"-bytes"] {
		l.Bytes = cur.Bytes
	}
	if !set[name+"-packets"] {
		l.Packets = cur.Packets
	}
	if !set[name+"-add"] {
		l.AddTime = cur.AddTime
	}
	if !set[name+"-use"] {
		l.UseTime = cur.UseTime
	}
}

func saDel(a *app, ctx context.Context, args []string) error {
	spi, dst, err := a.saID("sa del", args)
	if err != nil {
		return err
	}
	return a.request(ctx, func(ctx context.Context, c *control.Client) error {
		return c.DeleteSA(ctx, spi, dst)
	})
}

func saGet(a *app, ctx context.Context, args []string) error {
	spi, dst, err := a.saID("sa get", args)
	if err != nil {
		return err
	}
	get := func(c *control.Client, ctx context.Context) (wire.SAInfo, error) { return c.GetSA(ctx, spi, dst) }
	return query(a, ctx, get, saView, saPrinter())
}

func saList(a *app, ctx context.Context, args []string) error {
	return listCmd(a, ctx, "sa list", args, (*control.Client).ListSAs, saView, saPrinter())
}

func saFlush(a *app, ctx context.Context, args []string) error {
	if err := a.noFlags("sa flush", args); err != nil {
		return err
	}
	return a.request(ctx, func(ctx context.Context, c *control.Client) error { return c.FlushSAs(ctx) })
}

func policyAdd(a *app, ctx context.Context, args []string) error {
	return policyPut(a, ctx, args, "policy add", (*control.Client).AddPolicy)
}

func policyUpdate(a *app, ctx context.Context, args []string) error {
	return policyPut(a, ctx, args, "policy update", (*control.Client).UpdatePolicy)
}

func policyPut(a *app, ctx context.Context, args []string, name string,
	put func(*control.Client, context.Context, sa.Policy) (sa.Policy, error)) error {
	f := newPolicyFlags(name, true)
	if err := a.parse(f.fs, f.parse, args); err != nil {
		return err
	}
	p, err := f.policy()
	if err != nil {
		return usageError{err}
	}
	ask := func(c *control.Client, ctx context.Context) (sa.Policy, error) { return put(c, ctx, p) }
	return query(a, ctx, ask, policyView, printPolicy)
}

func policyDel(a *app, ctx context.Context, args []string) error {
	id, err := a.policyID("policy del", args)
	if err != nil {
		return err
	}
	return a.request(ctx, func(ctx context.Context, c *control.Client) error {
		return c.DeletePolicy(ctx, id)
	})
}

func policyGet(a *app, ctx context.Context, args []string) error {
	id, err := a.policyID("policy get", args)
	if err != nil {
		return err
	}
	get := func(c *control.Client, ctx context.Context) (sa.Policy, error) { return c.GetPolicy(ctx, id) }
	return query(a, ctx, get, policyView, printPolicy)
}

func policyList(a *app, ctx context.Context, args []string) error {
	return listCmd(a, ctx, "policy list", args, (*control.Client).ListPolicies, policyView, printPolicy)
}

func policyFlush(a *app, ctx context.Context, args []string) error {
	if err := a.noFlags("policy flush", args); err != nil {
		return err
	}
	return a.request(ctx, func(ctx context.Context, c *control.Client) error { return c.FlushPolicies(ctx) })
}

func spiAlloc(a *app, ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("spi alloc", flag.ContinueOnError)
	minS := fs.String("min", fmt.Sprintf("0x%08x", wire.DefaultSPIMin), "lowest SPI")
	maxS := fs.String("max", fmt.Sprintf("0x%08x", wire.DefaultSPIMax), "highest SPI")
	if err := a.parse(fs, fs.Parse, args); err != nil {
		return err
	}
	lo, err := parseSPI(*minS)
	if err != nil {
		return usageError{err}
	}
	hi, err := parseSPI(*maxS)
	if err != nil {
		return usageError{err}
	}
	if lo > hi {
		return usagef("spi alloc: --min 0x%08x is above --max 0x%08x", lo, hi)
	}
	alloc := func(c *control.Client, ctx context.Context) (uint32, error) { return c.AllocSPI(ctx, lo, hi) }
	return query(a, ctx, alloc, spiView, printSPI)
}

func stats(a *app, ctx context.Context, args []string) error {
	f := newSAFlags("stats", "id")
	if err := a.parse(f.fs, f.parse, args); err != nil {
		return err
	}
	var (
		spi uint32
		id  sa.Config
		one = f.set["spi"] || f.set["dst"]
	)
	if one {
		var err error
		if spi, id, err = f.id(); err != nil {
			return usageError{err}
		}
	}
	ask := func(c *control.Client, ctx context.Context) (control.Stats, error) {
		if one {
			return c.SAStats(ctx, spi, id.Dst)
		}
		return c.Stats(ctx)
	}
	return query(a, ctx, ask, statsView, printStats)
}

// parseEventKinds parses a comma-separated list of event kinds.
func parseEventKinds(s string) ([]wire.EventKind, error) {
	if s == "" || s == "all" {
		return nil, nil
	}
	var kinds []wire.EventKind
	for _, name := range strings.Split(s, ",") {
		found := false
		for _, k := range []wire.EventKind{wire.EventSoftExpire, wire.EventHardExpire, wire.EventAcquire, wire.EventMapping} {
			if name == k.String() || name == strings.TrimSuffix(k.String(), "-expire") {
				kinds = append(kinds, k)
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("--events: unknown event %q (soft-expire, hard-expire, acquire, mapping)", name)
		}
	}
	return kinds, nil
}

func monitor(a *app, ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("monitor", flag.ContinueOnError)
	kindsS := fs.String("events", "all", "event kinds: soft-expire,hard-expire,acquire,mapping")
	count := fs.Int("count", 0, "exit after this many events (0: run until interrupted)")
	if err := a.parse(fs, fs.Parse, args); err != nil {
		return err
	}
	kinds, err := parseEventKinds(*kindsS)
	if err != nil {
		return usageError{err}
	}
	c, err := a.client(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	sctx, cancel := context.WithTimeout(ctx, a.timeout)
	events, err := c.Subscribe(sctx, kinds...)
	cancel()
	if err != nil {
		return err
	}
	for n := 0; *count == 0 || n < *count; n++ {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-events:
			if !ok {
				return errors.New("connection to espd lost")
			}
			if err := show(a, e, eventView, printEvent); err != nil {
				return err
			}
		}
	}
	return nil
}

// pairRole sets the role of espd in its gateway pair (keepalived's notify
// script runs it) and prints the status after.
func pairRole(a *app, ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("pair role", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: espctl pair role active|standby")
		fs.PrintDefaults()
	}
	var name string
	parse := func(args []string) error {
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			return errors.New("pair role needs active or standby")
		}
		name = fs.Arg(0)
		if err := fs.Parse(fs.Args()[1:]); err != nil { // flags after the role
			return err
		}
		if fs.NArg() != 0 {
			return fmt.Errorf("unexpected argument %q", fs.Arg(0))
		}
		return nil
	}
	if err := a.parse(fs, parse, args); err != nil {
		return err
	}
	var role wire.PairRole
	switch name {
	case "active":
		role = wire.PairRoleActive
	case "standby":
		role = wire.PairRoleStandby
	default:
		return usagef("pair role %q: want active or standby", name)
	}
	set := func(c *control.Client, ctx context.Context) (wire.PairStatus, error) { return c.PairRole(ctx, role) }
	return query(a, ctx, set, pairView, printPair)
}

// pairStatus prints the status of espd's gateway pair.
func pairStatus(a *app, ctx context.Context, args []string) error {
	if err := a.noFlags("pair status", args); err != nil {
		return err
	}
	get := func(c *control.Client, ctx context.Context) (wire.PairStatus, error) {
		return c.PairRole(ctx, wire.PairRoleNone)
	}
	return query(a, ctx, get, pairView, printPair)
}
