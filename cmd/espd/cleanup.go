package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/espd/espd/daemon"
	"github.com/espd/espd/routing"
	"github.com/espd/espd/tun"
)

// runCleanup is "espd --cleanup": it takes espd out of the machine for
// good. espd leaves its rules, the blackhole routes that hold the
// prefixes of protect and drop policies and the throw routes of bypass
// policies behind when it is killed or stopped with policies installed, so
// that nothing it protected leaves in clear while it is away (routing's
// package doc). --cleanup removes them, and every other route espd put in
// its table, and prints each one. The held prefixes are open (routed by
// the main table) afterwards.
//
// It refuses while an espd appears to run on the same table, socket or
// TUN, since it would open that espd's protected prefixes under it: when
// the control socket accepts a connection, when the TUN device exists (a
// TUN exists only while its process holds it open), or when the table
// has a route into a device that exists (a route into a TUN goes with the
// TUN). An espd with another socket and another TUN name on the same table
// and no policy installed leaves no trace this could see, and would lose
// its rules: one table per espd, and --cleanup with the flags of the espd
// it cleans up after.
func runCleanup(opts daemon.Options, w io.Writer) error {
	kio := opts.IO
	cfg := routingConfig(opts)
	if err := espdRunning(opts.Control.Path, kio.TUN.Name, cfg); err != nil {
		return fmt.Errorf("--cleanup: %w", err)
	}
	removed, err := routing.Cleanup(cfg)
	for _, line := range removed {
		fmt.Fprintln(w, "removed", line)
	}
	if err != nil {
		return fmt.Errorf("--cleanup: %w", err)
	}
	if err := removeInterfaces(opts, w); err != nil {
		return fmt.Errorf("--cleanup: %w", err)
	}
	table := kio.Table
	if table == 0 {
		table = routing.DefaultTable
	}
	n := 0
	for _, line := range removed {
		if strings.HasPrefix(line, "rule ") || strings.HasPrefix(line, "route ") {
			n++
		}
	}
	switch {
	case len(removed) == 0:
		fmt.Fprintf(w, "nothing to remove: no rule looks up table %d and it has no route of espd's (proto %d)\n", table, routing.Protocol)
	case n == 0:
		fmt.Fprintf(w, "no rule looks up table %d and it has no route of espd's; removed the record of held prefixes\n", table)
	default:
		fmt.Fprintf(w, "removed %d rules and routes of table %d; nothing of espd's is left in the kernel's routing\n", n, table)
	}
	return nil
}

// routingConfig is the routing the daemon with opts uses, without its TUN.
func routingConfig(opts daemon.Options) routing.Config {
	kio := opts.IO
	cfg := routing.Config{Table: kio.Table, Mark: kio.Mark, Priority: kio.RulePriority, NoIPv6: kio.NoIPv6}
	if opts.StateDir != "" {
		cfg.HoldFile = daemon.HoldFile(opts.StateDir)
	}
	return cfg
}

// runRestoreHolds is "espd --restore-holds": at boot, before the network
// is up, it puts back the holds of the prefixes espd held when it last ran
// and the rules of their policies' sources (recorded in --state-dir), so
// that they stay closed until espd runs and their policies are installed
// again, and then creates the route-based interfaces espd recorded. It
// prints what it added.
//
// It fails closed: the holds come first, and no failure stops the rest. A
// hold file that does not check out holds everything instead
// (routing.RestoreHolds); a damaged record of interfaces, or an interface
// that cannot be created, leaves the holds in place and the other
// interfaces created. Then it returns an error naming every failure (the
// unit fails, visibly).
func runRestoreHolds(opts daemon.Options, w io.Writer) error {
	cfg := routingConfig(opts)
	if cfg.HoldFile == "" {
		return errors.New("--restore-holds: --state-dir is empty")
	}
	var errs []error
	added, err := routing.RestoreHolds(cfg)
	for _, line := range added {
		fmt.Fprintln(w, "added", line)
	}
	if err != nil {
		if errors.Is(err, routing.ErrHoldFile) {
			fmt.Fprintf(w, "HOLDING EVERYTHING: %s cannot be trusted, so every unmarked packet that is not for this host is dropped\n", cfg.HoldFile)
		}
		errs = append(errs, fmt.Errorf("holds: %w", err))
	}
	created, err := restoreInterfaces(opts, w)
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("--restore-holds: everything else is restored, but: %w", errors.Join(errs...))
	}
	if len(added) == 0 && created == 0 {
		fmt.Fprintf(w, "nothing to restore: %s lists no held prefix, or they are held already\n", cfg.HoldFile)
	}
	return nil
}

// espdRunning returns an error saying why if an espd seems to run with
// this socket, TUN device or table.
func espdRunning(sock, tunName string, cfg routing.Config) error {
	if sock != "" {
		c, err := net.DialTimeout("unix", sock, time.Second)
		switch {
		case err == nil:
			c.Close()
			return fmt.Errorf("espd is running: its control socket %s answers; stop it first (SIGTERM), then run --cleanup", sock)
		case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, os.ErrNotExist):
			// A stale socket of a dead espd, or none.
		default:
			return fmt.Errorf("cannot tell whether espd is running on %s: %w", sock, err)
		}
	}
	if tunName != "" {
		if _, err := net.InterfaceByName(tunName); err == nil {
			return fmt.Errorf("the TUN device %s exists, so the espd (or other program) that holds it is running; stop it first", tunName)
		}
	}
	live, err := routing.LiveRoutes(cfg)
	if err != nil {
		return err
	}
	if len(live) > 0 {
		return fmt.Errorf("an espd is running on this table: it routes into a device that exists: %s; stop it first", strings.Join(live, "; "))
	}
	return nil
}

// restoreInterfaces creates the route-based interfaces recorded in
// --state-dir as persistent TUN devices, so that the routes into them can
// be configured at boot and drop their traffic until espd runs. One that
// cannot be created (or whose name another kind of device has) does not
// stop the others. It returns how many it created and every failure.
func restoreInterfaces(opts daemon.Options, w io.Writer) (int, error) {
	path := daemon.InterfacesFile(opts.StateDir)
	specs, err := daemon.ReadInterfaces(path)
	if err != nil {
		return 0, fmt.Errorf("route-based interfaces: none created: %w", err)
	}
	n := 0
	var errs []error
	for _, s := range specs {
		made, err := restoreInterface(opts, s.Name, s.MTU)
		if err != nil {
			errs = append(errs, fmt.Errorf("route-based interface %s (if_id %d): %w", s.Name, s.IfID, err))
			continue
		}
		if made {
			fmt.Fprintf(w, "added route-based interface %s (if_id %d), dropping until espd runs\n", s.Name, s.IfID)
			n++
		}
	}
	return n, errors.Join(errs...)
}

// restoreInterface creates the persistent TUN name with mtu (0: --mtu)
// unless it is there.
func restoreInterface(opts daemon.Options, name string, mtu int) (made bool, err error) {
	if link, err := netlink.LinkByName(name); err == nil {
		if t, ok := link.(*netlink.Tuntap); !ok || t.Mode != netlink.TUNTAP_MODE_TUN {
			return false, fmt.Errorf("the device of that name (type %s) is %w", link.Type(), tun.ErrNotTUN)
		}
		return false, nil // there already: an espd or an earlier run made it
	}
	cfg := opts.IO.TUN
	cfg.Name, cfg.Persist, cfg.NoURing = name, true, true // it only creates it
	if mtu != 0 {
		cfg.MTU = mtu
	}
	dev, err := tun.Create(cfg)
	if err != nil {
		return false, err
	}
	dev.Close() // persistent: it stays, and drops what is routed into it
	if _, err := routing.LooseRPFilter(name); err != nil {
		return true, fmt.Errorf("created, but rp_filter: %w", err)
	}
	return true, nil
}

// removeInterfaces deletes the route-based interfaces recorded in
// --state-dir and the record.
func removeInterfaces(opts daemon.Options, w io.Writer) error {
	if opts.StateDir == "" {
		return nil
	}
	path := daemon.InterfacesFile(opts.StateDir)
	specs, err := daemon.ReadInterfaces(path)
	if err != nil {
		return err
	}
	for _, s := range specs {
		if err := tun.Delete(s.Name); err != nil {
			return err
		}
		fmt.Fprintf(w, "removed route-based interface %s (if_id %d)\n", s.Name, s.IfID)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
