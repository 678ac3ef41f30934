package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/espd/espd/control"
	"github.com/espd/espd/sa"
)

func saAdd(a *app, ctx context.Context, args []string) error {
	f := newSAFlags("sa add", "config")
	if err := a.parse(f.fs, f.parse, args); err != nil {
		return err
	}
	cfg, _, err := f.config(true)
	if err != nil {
		return usageError{err}
	}
	defer clear(cfg.EncKey)
	defer clear(cfg.IntegKey)
	return a.request(ctx, func(ctx context.Context, c *control.Client) error {
		return c.AddSA(ctx, cfg)
	})
}

func saUpdate(a *app, ctx context.Context, args []string) error {
	f := newSAFlags("sa update", "config", "update")
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
	if err != nil {
		return usageError{err}
	}
	defer clear(cfg.EncKey)
	defer clear(cfg.IntegKey)
	if fields == 0 {
		return usagef("sa update: nothing to change")
	}
	return a.request(ctx, func(ctx context.Context, c *control.Client) error {
		// A lifetime travels whole: keep the limits not given.
		if fields&(control.FieldSoft|control.FieldHard) != 0 {
			cur, err := c.GetSA(ctx, spi, id.Dst)
			if err != nil {
				return err
			}
			mergeLifetime(&cfg.Soft, cur.Config.Soft, f.set, "soft")
			mergeLifetime(&cfg.Hard, cur.Config.Hard, f.set, "hard")
		}
		return c.UpdateSA(ctx, control.SAUpdate{SPI: spi, Dst: id.Dst, Config: cfg, Fields: fields})
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
	f := newSAFlags("sa del", "id")
	if err := a.parse(f.fs, f.parse, args); err != nil {
		return err
	}
	spi, id, err := f.id()
	if err != nil {
		return usageError{err}
	}
	return a.request(ctx, func(ctx context.Context, c *control.Client) error {
		return c.DeleteSA(ctx, spi, id.Dst)
	})
}

func saGet(a *app, ctx context.Context, args []string) error {
	f := newSAFlags("sa get", "id")
	if err := a.parse(f.fs, f.parse, args); err != nil {
		return err
	}
	spi, id, err := f.id()
	if err != nil {
		return usageError{err}
	}
	return a.request(ctx, func(ctx context.Context, c *control.Client) error {
		in, err := c.GetSA(ctx, spi, id.Dst)
		if err != nil {
			return err
		}
		if a.json {
			return writeJSON(a.stdout, saView(in))
		}
		printSA(a.stdout, in, time.Now())
		return nil
	})
}

// noFlags parses the flags of a command that takes none but --json.
func (a *app) noFlags(name string, args []string) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	return a.parse(fs, func(args []string) error {
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() != 0 {
			return fmt.Errorf("unexpected argument %q", fs.Arg(0))
		}
		return nil
	}, args)
}

func saList(a *app, ctx context.Context, args []string) error {
	if err := a.noFlags("sa list", args); err != nil {
		return err
	}
	return a.request(ctx, func(ctx context.Context, c *control.Client) error {
		list, err := c.ListSAs(ctx)
		if err != nil {
			return err
		}
		if a.json {
			views := make([]saJSON, 0, len(list))
			for _, in := range list {
				views = append(views, saView(in))
			}
			return writeJSON(a.stdout, views)
		}
		now := time.Now()
		for _, in := range list {
			printSA(a.stdout, in, now)
		}
		return nil
	})
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
	return a.request(ctx, func(ctx context.Context, c *control.Client) error {
		got, err := put(c, ctx, p)
		if err != nil {
			return err
		}
		if a.json {
			return writeJSON(a.stdout, policyView(got))
		}
		printPolicy(a.stdout, got)
		return nil
	})
}

func policyDel(a *app, ctx context.Context, args []string) error {
	f := newPolicyFlags("policy del", false)
	if err := a.parse(f.fs, f.parse, args); err != nil {
		return err
	}
	sel, dir, err := f.selector()
	if err != nil {
		return usageError{err}
	}
	return a.request(ctx, func(ctx context.Context, c *control.Client) error {
		return c.DeletePolicy(ctx, sel, dir)
	})
}

func policyGet(a *app, ctx context.Context, args []string) error {
	f := newPolicyFlags("policy get", false)
	if err := a.parse(f.fs, f.parse, args); err != nil {
		return err
	}
	sel, dir, err := f.selector()
	if err != nil {
		return usageError{err}
	}
	return a.request(ctx, func(ctx context.Context, c *control.Client) error {
		p, err := c.GetPolicy(ctx, sel, dir)
		if err != nil {
			return err
		}
		if a.json {
			return writeJSON(a.stdout, policyView(p))
		}
		printPolicy(a.stdout, p)
		return nil
	})
}

func policyList(a *app, ctx context.Context, args []string) error {
	if err := a.noFlags("policy list", args); err != nil {
		return err
	}
	return a.request(ctx, func(ctx context.Context, c *control.Client) error {
		list, err := c.ListPolicies(ctx)
		if err != nil {
			return err
		}
		if a.json {
			views := make([]policyJSON, 0, len(list))
			for _, p := range list {
				views = append(views, policyView(p))
			}
			return writeJSON(a.stdout, views)
		}
		for _, p := range list {
			printPolicy(a.stdout, p)
		}
		return nil
	})
}

func policyFlush(a *app, ctx context.Context, args []string) error {
	if err := a.noFlags("policy flush", args); err != nil {
		return err
	}
	return a.request(ctx, func(ctx context.Context, c *control.Client) error { return c.FlushPolicies(ctx) })
}

func spiAlloc(a *app, ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("spi alloc", flag.ContinueOnError)
	minS := fs.String("min", fmt.Sprintf("0x%08x", control.DefaultSPIMin), "lowest SPI")
	maxS := fs.String("max", fmt.Sprintf("0x%08x", control.DefaultSPIMax), "highest SPI")
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
	return a.request(ctx, func(ctx context.Context, c *control.Client) error {
		spi, err := c.AllocSPI(ctx, lo, hi)
		if err != nil {
			return err
		}
		if a.json {
			return writeJSON(a.stdout, map[string]any{"spi": spi, "spi_hex": fmt.Sprintf("0x%08x", spi)})
		}
		fmt.Fprintf(a.stdout, "0x%08x\n", spi)
		return nil
	})
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
	return a.request(ctx, func(ctx context.Context, c *control.Client) error {
		var st control.Stats
		var err error
		if one {
			st, err = c.SAStats(ctx, spi, id.Dst)
		} else {
			st, err = c.Stats(ctx)
		}
		if err != nil {
			return err
		}
		if a.json {
			return writeJSON(a.stdout, statsView(st))
		}
		printStats(a.stdout, st)
		return nil
	})
}

// parseEventKinds parses a comma-separated list of event kinds.
func parseEventKinds(s string) ([]control.EventKind, error) {
	if s == "" || s == "all" {
		return nil, nil
	}
	var kinds []control.EventKind
	for _, name := range strings.Split(s, ",") {
		found := false
		for _, k := range []control.EventKind{control.EventSoftExpire, control.EventHardExpire, control.EventAcquire, control.EventMapping} {
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
			if a.json {
				if err := writeJSON(a.stdout, eventView(e)); err != nil {
					return err
				}
			} else {
				printEvent(a.stdout, e)
			}
		}
	}
	return nil
}
