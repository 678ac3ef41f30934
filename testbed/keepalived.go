package testbed

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Keepalived is the path of Debian's keepalived, the VRRP daemon that
// moves a Pair's virtual addresses.
const Keepalived = "/usr/sbin/keepalived"

// KeepalivedOptions configure one node's keepalived for a Pair.
type KeepalivedOptions struct {
	// Priority decides which node holds the addresses (the higher); the
	// two nodes' must differ.
	Priority int
	// NoPreempt keeps the addresses where they are when a node of higher
	// priority comes back (failback only when the holder fails).
	NoPreempt bool
	// AdvertInt is the VRRPv3 advertisement interval in seconds ("0.2");
	// empty means "1". A backup takes over after about three missed.
	AdvertInt string
	// NotifyFIFO and NotifyScript, if set, make keepalived write its state
	// changes, in order, into the FIFO NotifyFIFO and run NotifyScript (as
	// root) to read them (vrrp_notify_fifo, vrrp_notify_fifo_script).
	NotifyFIFO, NotifyScript string
	// Checks are tracked by the sync group: each runs every second (2 s
	// timeout); two failures in a row put the group in FAULT (weight 0),
	// two successes bring it back.
	Checks []KeepalivedCheck
}

// KeepalivedCheck is a vrrp_script: Script is the command keepalived runs.
type KeepalivedCheck struct{ Name, Script string }

// KeepalivedConf returns a keepalived.conf for node (its router_id) of a
// Pair: VRRPv3, one instance on the transit link (virtual router 51) and
// one on the LAN link (52) holding gateway A's addresses (the IPv6 ones
// not advertised), in one sync group, so that one node holds all of them,
// and that tracks o.Checks.
func KeepalivedConf(node string, o KeepalivedOptions) string {
	adv := o.AdvertInt
	if adv == "" {
		adv = "1"
	}
	preempt := ""
	if o.NoPreempt {
		preempt = "    nopreempt\n"
	}
	inst := func(name, ifn string, vrid int, v4, v6 string) string {
		return fmt.Sprintf(`vrrp_instance %s {
    state BACKUP
    interface %s
    virtual_router_id %d
    priority %d
    advert_int %s
%s    virtual_ipaddress {
        %s dev %s
    }
    virtual_ipaddress_excluded {
        %s dev %s
    }
}
`, name, ifn, vrid, o.Priority, adv, preempt, v4, ifn, v6, ifn)
	}
	notify := ""
	if o.NotifyFIFO != "" {
		notify = fmt.Sprintf("    script_user root\n    vrrp_notify_fifo %s\n    vrrp_notify_fifo_script %q\n", o.NotifyFIFO, o.NotifyScript)
	}
	var scripts, track strings.Builder
	for _, c := range o.Checks {
		fmt.Fprintf(&scripts, "vrrp_script %s {\n    script %q\n    interval 1\n    timeout 2\n    fall 2\n    rise 2\n    weight 0\n}\n",
			c.Name, c.Script)
		fmt.Fprintf(&track, "        %s\n", c.Name)
	}
	tracked := ""
	if track.Len() > 0 {
		tracked = "    track_script {\n" + track.String() + "    }\n"
	}
	return fmt.Sprintf(`global_defs {
    router_id %s
    vrrp_version 3
%s}
%svrrp_sync_group PAIR {
    group {
        WAN
        LAN
    }
%s}
`, node, notify, scripts.String(), tracked) + inst("WAN", IfTransit, 51, GwATransitV4.String(), GwATransitV6.String()) +
		inst("LAN", IfLAN, 52, GwALANV4.String(), GwALANV6.String())
}

// StartKeepalived writes conf into dir and starts keepalived in n with it
// (VRRP only, in the foreground, logging to dir/keepalived-<role>.log, its
// pid files in dir). It fails the test if keepalived is not installed or
// will not start.
func StartKeepalived(tb testing.TB, n *Node, dir, conf string) *Process {
	tb.Helper()
	if _, err := exec.LookPath(Keepalived); err != nil {
		tb.Fatalf("testbed: %v (apt-get install keepalived)", err)
	}
	base := filepath.Join(dir, "keepalived-"+n.Role)
	if err := writeFile(base+".conf", conf); err != nil {
		tb.Fatal(err)
	}
	p, err := n.Start(base+".log", Keepalived, "--vrrp", "--dont-fork", "--log-console", "--log-detail",
		"--use-file", base+".conf", "--pid", base+".pid", "--vrrp_pid", base+".vrrp.pid")
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// HoldsAddr reports whether n has the address a (without prefix length) on
// any interface.
func (n *Node) HoldsAddr(ctx context.Context, a string) bool {
	out, err := n.IP(ctx, "-o", "addr", "show")
	return err == nil && strings.Contains(out, " "+a+"/")
}

// WaitHeldBy waits, at most timeout, until want is the only one of nodes
// that holds the address a, and reports whether it came to; holders are
// the nodes that held a at the last look.
func WaitHeldBy(nodes []*Node, want *Node, a string, timeout time.Duration) (ok bool, holders []string) {
	ok = Poll(timeout, 20*time.Millisecond, func() bool {
		holders = nil
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		alone := true
		for _, n := range nodes {
			if n.HoldsAddr(ctx, a) {
				holders = append(holders, n.Role)
				alone = alone && n == want
			} else if n == want {
				alone = false
			}
		}
		return alone
	})
	return ok, holders
}

// writeFile writes text to path (mode 0600).
func writeFile(path, text string) error { return os.WriteFile(path, []byte(text), 0o600) }

// WriteNotifyScript writes script (docs/ha.md's notify script, as
// written) into dir and, beside it, a wrapper that exports env ("NAME=value",
// values without spaces or quotes are safest) and runs it; it returns the
// wrapper's path, for KeepalivedOptions.NotifyScript.
func WriteNotifyScript(tb testing.TB, dir, script string, env ...string) string {
	tb.Helper()
	doc := filepath.Join(dir, "espd-pair-notify")
	wrapper := filepath.Join(dir, "notify.sh")
	var b strings.Builder
	b.WriteString("#!/bin/sh\n")
	for _, e := range env {
		name, value, _ := strings.Cut(e, "=")
		fmt.Fprintf(&b, "export %s=%q\n", name, value)
	}
	fmt.Fprintf(&b, "exec sh %q \"$@\"\n", doc)
	if err := os.WriteFile(doc, []byte(script), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(wrapper, []byte(b.String()), 0o755); err != nil {
		tb.Fatal(err)
	}
	return wrapper
}
