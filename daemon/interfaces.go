package daemon

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/espd/espd/config"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/routing"
	"github.com/espd/espd/statefile"
	"github.com/espd/espd/tun"
)

// InterfacesFile is the record of the route-based interfaces in a state
// directory: espd --restore-holds creates them at boot, before the
// network, so that the routes into them exist and drop until espd runs,
// and espd --cleanup removes them.
func InterfacesFile(stateDir string) string { return filepath.Join(stateDir, "interfaces") }

// ifaceDev is a route-based interface the daemon keeps: the configuration
// file's [[interface]] and its persistent TUN, carried by the data plane.
type ifaceDev struct {
	spec config.Interface
	dev  *tun.Device
	// attached: the device was there before this espd took it (made by
	// --restore-holds or a previous espd, maybe with routes on it).
	attached bool
}

// addInterfaceLocked creates (or attaches to) the persistent TUN of spec
// and hands it to the data plane. d.mu is held.
func (d *Daemon) addInterfaceLocked(spec config.Interface) error {
	cfg := d.opts.IO.TUN
	cfg.Name, cfg.Persist = spec.Name, true
	if spec.MTU != 0 {
		cfg.MTU = spec.MTU
	}
	_, err := net.InterfaceByName(spec.Name)
	attached := err == nil
	dev, err := tun.Create(cfg)
	if err != nil {
		return fmt.Errorf("interface %s (if_id %d): %w", spec.Name, spec.IfID, err)
	}
	// Decrypted packets come out of it from sources the main table
	// routes elsewhere.
	if _, err := routing.LooseRPFilter(spec.Name); err != nil {
		d.log.Warn("route-based interface's rp_filter stays strict: it drops what espd delivers", "interface", spec.Name, "err", err)
	}
	if err := d.dp.AddInterface(spec.IfID, dev); err != nil {
		dev.Close()
		return fmt.Errorf("interface %s (if_id %d): %w", spec.Name, spec.IfID, err)
	}
	d.ifaces[spec.IfID] = &ifaceDev{spec: spec, dev: dev, attached: attached}
	d.log.Info("route-based interface up", "interface", spec.Name, "if_id", spec.IfID, "mtu", dev.MTU())
	return nil
}

// removeInterfaceLocked deletes a route-based interface: the kernel removes
// the device and the routes into it. d.mu is held.
func (d *Daemon) removeInterfaceLocked(id uint32) error {
	ifc := d.ifaces[id]
	if ifc == nil {
		return nil
	}
	delete(d.ifaces, id)
	err := ifc.dev.SetPersist(false)
	err = errors.Join(err, d.dp.RemoveInterface(id))
	if err != nil {
		// Still persistent (or half removed): delete the device outright.
		err = errors.Join(err, tun.Delete(ifc.spec.Name))
	}
	d.log.Info("route-based interface removed", "interface", ifc.spec.Name, "if_id", id)
	return err
}

// undoInterfaceLocked undoes addInterfaceLocked for a refused
// configuration: a device it created goes (removeInterfaceLocked); one it
// attached to stays, persistent, with the routes on it, dropping what is
// routed there as before. d.mu is held.
func (d *Daemon) undoInterfaceLocked(id uint32) error {
	ifc := d.ifaces[id]
	if ifc == nil || !ifc.attached {
		return d.removeInterfaceLocked(id)
	}
	delete(d.ifaces, id)
	return d.dp.RemoveInterface(id)
}

// checkInterfaces refuses interfaces the daemon cannot create.
func (d *Daemon) checkInterfaces(want []config.Interface) error {
	for i, ifc := range want {
		if ifc.Name == d.opts.IO.TUN.Name {
			return fmt.Errorf("%s: interface #%d: %s is espd's policy-based TUN", d.opts.ConfigPath, i+1, ifc.Name)
		}
	}
	return nil
}

// ifaceChanges is what a configuration changes in the route-based
// interfaces.
type ifaceChanges struct {
	add    []config.Interface // interface IDs espd does not have
	mtu    []config.Interface // same ID and name, another MTU: changed in place
	remove []uint32           // interface IDs the configuration no longer has
}

// interfacesChange works out what want changes. It refuses a change of
// name and an MTU the data plane cannot carry: a renamed interface would
// lose the routes an administrator put on it, and its traffic would fall
// through to other routes. It changes nothing.
func (d *Daemon) interfacesChange(want []config.Interface) (ifaceChanges, error) {
	var ch ifaceChanges
	keep := map[uint32]bool{}
	for _, ifc := range want {
		if m := d.interfaceMTU(ifc); m > dataplane.BufferSize-dataplane.MaxFraming {
			return ch, fmt.Errorf("%s: interface %s (if_id %d): mtu %d is above the %d the data plane carries",
				d.opts.ConfigPath, ifc.Name, ifc.IfID, m, dataplane.BufferSize-dataplane.MaxFraming)
		}
		cur := d.ifaces[ifc.IfID]
		switch {
		case cur == nil:
			ch.add = append(ch.add, ifc)
		case cur.spec.Name != ifc.Name:
			return ch, fmt.Errorf("%s: interface if_id %d: renaming %s to %s is refused: the routes on %s cannot be carried over; "+
				"remove the [[interface]] in one reload and add it in another, or restart espd", d.opts.ConfigPath, ifc.IfID, cur.spec.Name, ifc.Name, cur.spec.Name)
		case cur.spec.MTU != ifc.MTU:
			ch.mtu = append(ch.mtu, ifc)
		}
		keep[ifc.IfID] = true
	}
	for id := range d.ifaces {
		if !keep[id] {
			ch.remove = append(ch.remove, id)
		}
	}
	slices.Sort(ch.remove)
	return ch, nil
}

// interfaceMTU is the MTU of spec's device: its own, or espd's TUN's.
func (d *Daemon) interfaceMTU(spec config.Interface) int {
	if spec.MTU != 0 {
		return spec.MTU
	}
	return cmp.Or(d.opts.IO.TUN.MTU, tun.DefaultMTU)
}

// setInterfaceMTULocked changes the MTU of the interface of spec.IfID to
// spec's in place (tun.Device.SetMTU): the device and the routes into it
// stay, and the data plane reads the new MTU from the device. d.mu is
// held.
func (d *Daemon) setInterfaceMTULocked(spec config.Interface) error {
	ifc := d.ifaces[spec.IfID]
	if ifc == nil {
		return fmt.Errorf("interface if_id %d: not there", spec.IfID)
	}
	if err := ifc.dev.SetMTU(d.interfaceMTU(spec)); err != nil {
		return fmt.Errorf("interface %s (if_id %d): %w", spec.Name, spec.IfID, err)
	}
	ifc.spec = spec
	d.log.Info("route-based interface MTU changed in place", "interface", spec.Name, "if_id", spec.IfID, "mtu", ifc.dev.MTU())
	return nil
}

// recordInterfacesLocked writes the interfaces to InterfacesFile, or
// removes it when there are none. d.mu is held.
func (d *Daemon) recordInterfacesLocked() error {
	if d.opts.StateDir == "" {
		return nil
	}
	path := InterfacesFile(d.opts.StateDir)
	specs := make([]config.Interface, 0, len(d.ifaces))
	for _, ifc := range d.ifaces {
		specs = append(specs, ifc.spec)
	}
	if len(specs) == 0 {
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	return WriteInterfaces(path, specs)
}

// interfacesHeader is the record's first line.
const interfacesHeader = "# espd's route-based interfaces (name if_id mtu), created at boot by espd --restore-holds"

// WriteInterfaces records specs in path (InterfacesFile's format: a
// comment, one "name if_id mtu" line per interface, and statefile's
// trailer), replacing it atomically and durably (statefile.Write).
func WriteInterfaces(path string, specs []config.Interface) error {
	specs = slices.Clone(specs)
	slices.SortFunc(specs, func(a, b config.Interface) int { return cmp.Compare(a.IfID, b.IfID) })
	var b bytes.Buffer
	b.WriteString(interfacesHeader + "\n")
	for _, s := range specs {
		fmt.Fprintf(&b, "%s %d %d\n", s.Name, s.IfID, s.MTU)
	}
	if err := statefile.Write(path, b.Bytes()); err != nil {
		return fmt.Errorf("record of route-based interfaces: %w", err)
	}
	return nil
}

// ReadInterfaces reads a record WriteInterfaces wrote; a missing file
// holds none. A damaged one (empty, cut short, without its trailer, a
// checksum or line that does not check out) is refused as a whole, with
// an error wrapping statefile.ErrDamaged.
func ReadInterfaces(path string) ([]config.Interface, error) {
	data, found, err := statefile.Read(path)
	if err != nil || !found {
		return nil, err
	}
	var specs []config.Interface
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if n == 1 {
			if line != interfacesHeader {
				return nil, fmt.Errorf("%s:1: %w: header %q", path, statefile.ErrDamaged, line)
			}
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			return nil, fmt.Errorf("%s:%d: %w: want \"name if_id mtu\", got %q", path, n, statefile.ErrDamaged, line)
		}
		id, err1 := strconv.ParseUint(f[1], 10, 32)
		mtu, err2 := strconv.Atoi(f[2])
		if err := config.CheckInterfaceName(f[0]); err != nil || err1 != nil || err2 != nil || id == 0 ||
			(mtu != 0 && (mtu < config.MinInterfaceMTU || mtu > config.MaxInterfaceMTU)) {
			return nil, fmt.Errorf("%s:%d: %w: not an interface record: %q", path, n, statefile.ErrDamaged, line)
		}
		specs = append(specs, config.Interface{Name: f[0], IfID: uint32(id), MTU: mtu})
	}
	return specs, sc.Err()
}

// recordedInterfaces returns the interfaces a previous espd recorded.
func (d *Daemon) recordedInterfaces() []config.Interface {
	if d.opts.StateDir == "" {
		return nil
	}
	old, err := ReadInterfaces(InterfacesFile(d.opts.StateDir))
	if err != nil {
		d.log.Error("cannot read the record of route-based interfaces: one removed from the configuration while espd was stopped stays; the record is written anew", "err", err)
	}
	return old
}

// dropStaleInterfaces deletes the interfaces a previous espd recorded
// (old) that the configuration no longer has (removed while espd was
// stopped).
func (d *Daemon) dropStaleInterfaces(old []config.Interface) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, o := range old {
		if cur := d.ifaces[o.IfID]; cur != nil && cur.spec.Name == o.Name {
			continue
		}
		if err := tun.Delete(o.Name); err != nil {
			d.log.Warn("cannot delete a route-based interface the configuration no longer has", "interface", o.Name, "err", err)
			continue
		}
		d.log.Info("deleted a route-based interface the configuration no longer has", "interface", o.Name, "if_id", o.IfID)
	}
	d.recordInterfaces()
}

// warnNoInterface logs, once per interface ID, that a state or policy of
// a route-based interface ID arrived while espd has no interface for it:
// its traffic is dropped until the configuration file declares one.
func (d *Daemon) warnNoInterface(id uint32, what, desc string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.warnNoInterfaceLocked(id, what, desc)
}

// warnNoInterfaceLocked is warnNoInterface with d.mu held.
func (d *Daemon) warnNoInterfaceLocked(id uint32, what, desc string) {
	if id == 0 || d.ifaces[id] != nil || d.warnedIfIDs[id] {
		return
	}
	if d.warnedIfIDs == nil {
		d.warnedIfIDs = map[uint32]bool{}
	}
	d.warnedIfIDs[id] = true
	d.log.Warn("a "+what+" of a route-based interface ID that has no interface: its traffic is dropped until the configuration file declares an [[interface]] with this if_id (docs/strongswan.md, Route-based tunnels)",
		"if_id", id, what, desc)
}
