package daemon

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"slices"

	"github.com/espd/espd/config"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/sa"
)

// saKey identifies a state as XFRM does: SPI and destination.
type saKey struct {
	spi uint32
	dst netip.Addr
}

// policyKey identifies a policy: selector, direction and interface ID.
type policyKey = sa.PolicyID

// fileState is what the configuration file installed, so that a reload
// knows what to change and leaves what the control socket installed alone.
// It holds no keys: a fingerprint tells whether they changed.
type fileState struct {
	sas      map[saKey]fileSA
	policies map[policyKey]sa.Policy
}

// fileSA is a state from the file without its keys.
type fileSA struct {
	cfg  sa.Config // EncKey and IntegKey nil
	keys crypto.Fingerprint
}

// Reload reads the configuration file again and applies the difference to
// what the previous file installed, all or nothing: a file that cannot be
// read, parsed or applied (an invalid state, an SPI or a key that another
// state has, a sequence-number store that fails, a route that cannot be
// installed) leaves states, policies, routes and the bookkeeping exactly
// as they were, and Reload returns why. What the control socket installed
// is left alone; a file that collides with it is refused.
//
// A state whose key, suite, direction, mode, reqid and replay window stay
// is updated in place. Any other change replaces it; under the same key the
// replacement continues the old state (sa.Changes.AddSAs): outbound above
// its sequence numbers, inbound with its replay window, so a change of
// suite (to ESN, to a 12-byte ICV) or reqid never repeats a nonce.
//
// The file and its key files are read, parsed and applied under
// crypto.DoSecret: the text is cleared once parsed, the keys once
// installed, and the TOML decoder's own copies of inline keys are erased
// when the collector frees them.
func (d *Daemon) Reload() (err error) {
	if d.opts.ConfigPath == "" {
		return errors.New("no configuration file (--config) to reload")
	}
	crypto.DoSecret(func() { err = d.reload() })
	return err
}

func (d *Daemon) reload() error {
	data, err := os.ReadFile(d.opts.ConfigPath)
	if err != nil {
		return err
	}
	f, err := config.Parse(d.opts.ConfigPath, data)
	clear(data)
	if err != nil {
		return err
	}
	defer f.Wipe()
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.applyLocked(f)
}

// reloadPlan is what applying a file takes.
type reloadPlan struct {
	changes sa.Changes
	// install are the policies whose routes go in before the change,
	// remove the replaced or removed ones whose routes go after it.
	install, remove []sa.Policy
	next            fileState
}

// applyLocked makes the running state match f for everything the file
// owns, all or nothing: the routes the new policies need first, then
// every state and policy change at once (sa.DB.Apply), then the routes of
// the policies that went. d.mu is held.
func (d *Daemon) applyLocked(f *config.File) error {
	pl, err := d.planLocked(f)
	if err != nil {
		return err
	}
	if err := d.checkInterfaces(f.Interfaces); err != nil {
		return err
	}
	ifch, err := d.interfacesChange(f.Interfaces)
	if err != nil {
		return err
	}
	// New interface IDs and MTU changes go in first, and are undone on a
	// refusal; an MTU changes in place, so the routes into the interface
	// stay and nothing routed there falls through to another route.
	var installed []sa.Policy
	var added []uint32
	var mtuWas []config.Interface
	undo := func() {
		for _, p := range slices.Backward(installed) {
			if err := d.routes.RemovePolicyRoute(p); err != nil {
				d.log.Error("undoing the route of a refused configuration", "policy", p.String(), "err", err)
			}
		}
		for _, id := range added {
			if err := d.undoInterfaceLocked(id); err != nil {
				d.log.Error("undoing a route-based interface of a refused configuration", "if_id", id, "err", err)
			}
		}
		for _, old := range mtuWas {
			if err := d.setInterfaceMTULocked(old); err != nil {
				d.log.Error("undoing the MTU change of a refused configuration", "if_id", old.IfID, "err", err)
			}
		}
		if err := d.recordInterfacesLocked(); err != nil {
			d.stateWriteFailed(stateFileInterfaces, err)
		}
	}
	for _, ifc := range ifch.add {
		if err := d.addInterfaceLocked(ifc); err != nil {
			undo()
			return fmt.Errorf("%s: %w", d.opts.ConfigPath, err)
		}
		added = append(added, ifc.IfID)
	}
	for _, ifc := range ifch.mtu {
		old := d.ifaces[ifc.IfID].spec
		if err := d.setInterfaceMTULocked(ifc); err != nil {
			undo()
			return fmt.Errorf("%s: %w", d.opts.ConfigPath, err)
		}
		mtuWas = append(mtuWas, old)
	}
	for _, p := range pl.install {
		if err := d.routes.InstallPolicyRoute(p); err != nil {
			undo()
			return fmt.Errorf("%s: route for policy %s dir %s: %w", d.opts.ConfigPath, p.Selector, p.Dir, err)
		}
		installed = append(installed, p)
	}
	if err := d.db.Apply(pl.changes); err != nil {
		undo()
		return fmt.Errorf("%s: %w", d.opts.ConfigPath, err)
	}
	d.file = pl.next
	for _, c := range pl.changes.AddSAs {
		d.warnSlowAES(c.Suite)
	}
	// The change is made: a route reference that cannot be dropped now
	// keeps its prefix routed into the TUN (or held), which drops the
	// traffic, never leaks it; it is logged, not undone.
	for _, p := range pl.remove {
		if err := d.routes.RemovePolicyRoute(p); err != nil {
			d.log.Warn("removing the route of a policy the configuration no longer has", "policy", p.String(), "err", err)
		}
	}
	for _, id := range ifch.remove {
		if err := d.removeInterfaceLocked(id); err != nil {
			d.log.Warn("removing a route-based interface the configuration no longer has", "if_id", id, "err", err)
		}
	}
	if err := d.recordInterfacesLocked(); err != nil {
		d.stateWriteFailed(stateFileInterfaces, err)
		return &recordError{err: err}
	}
	return nil
}

// recordError is Reload's error when the configuration is applied but the
// record of the route-based interfaces for the next boot cannot be
// written: the running state is the file's, the next boot may miss it.
type recordError struct{ err error }

func (e *recordError) Error() string {
	return "configuration applied, but the route-based interfaces cannot be recorded for the next boot: " + e.err.Error()
}

func (e *recordError) Unwrap() error { return e.err }

// recordInterfaces records the interfaces for the next boot; a failure is
// logged at error level and counted (stateWriteFailed). d.mu is held.
func (d *Daemon) recordInterfaces() {
	if err := d.recordInterfacesLocked(); err != nil {
		d.stateWriteFailed(stateFileInterfaces, err)
	}
}

// planLocked works out what applying f changes, refusing a file that
// collides with what the control socket installed. It changes nothing.
// d.mu is held.
func (d *Daemon) planLocked(f *config.File) (*reloadPlan, error) {
	pl := &reloadPlan{next: fileState{sas: map[saKey]fileSA{}, policies: map[policyKey]sa.Policy{}}}
	ch := &pl.changes
	for i := range f.SAs {
		c := f.SAs[i]
		k := saKey{c.SPI, c.Dst}
		old, owned := d.file.sas[k]
		_, live := d.db.GetSA(c.SPI, c.Dst)
		if !owned && live {
			return nil, fmt.Errorf("%s: sa #%d (SPI 0x%08x to %s) is already installed through the control socket; delete it first", d.opts.ConfigPath, i+1, c.SPI, c.Dst)
		}
		redacted := c
		redacted.EncKey, redacted.IntegKey = nil, nil
		n := fileSA{cfg: redacted, keys: crypto.KeyFingerprint(c.EncKey, c.IntegKey)}
		pl.next.sas[k] = n
		switch {
		case !owned || !live:
			ch.AddSAs = append(ch.AddSAs, c)
		case reflect.DeepEqual(old, n):
			// unchanged
		case updatable(old, n):
			ch.UpdateSAs = append(ch.UpdateSAs, redacted)
		default:
			ch.DeleteSAs = append(ch.DeleteSAs, sa.StateID{SPI: k.spi, Dst: k.dst})
			ch.AddSAs = append(ch.AddSAs, c)
		}
	}
	for k := range d.file.sas {
		if _, keep := pl.next.sas[k]; !keep {
			ch.DeleteSAs = append(ch.DeleteSAs, sa.StateID{SPI: k.spi, Dst: k.dst})
		}
	}

	for i, p := range f.Policies {
		k := p.ID()
		old, owned := d.file.policies[k]
		_, live := d.db.GetPolicy(k)
		if !owned && live {
			return nil, fmt.Errorf("%s: policy #%d (%s dir %s) is already installed through the control socket; delete it first", d.opts.ConfigPath, i+1, p.Selector, p.Dir)
		}
		if _, dup := pl.next.policies[k]; dup {
			return nil, fmt.Errorf("%s: policy #%d (%s dir %s) is given twice", d.opts.ConfigPath, i+1, p.Selector, p.Dir)
		}
		pl.next.policies[k] = p
		if owned && live && samePolicy(old, p) {
			continue
		}
		ch.Policies = append(ch.Policies, p)
		pl.install = append(pl.install, p)
		if owned && live {
			pl.remove = append(pl.remove, old)
		}
	}
	for k, old := range d.file.policies {
		if _, keep := pl.next.policies[k]; keep {
			continue
		}
		ch.DeletePolicies = append(ch.DeletePolicies, old.ID())
		if _, live := d.db.GetPolicy(old.ID()); live {
			pl.remove = append(pl.remove, old)
		}
	}
	return pl, nil
}

// updatable reports whether the file's state o can become n in place
// (sa.DB.UpdateSA): same direction, keys, suite, mode, reqid and replay
// window.
func updatable(o, n fileSA) bool {
	return o.keys == n.keys && o.cfg.Dir == n.cfg.Dir && o.cfg.Suite == n.cfg.Suite && o.cfg.Mode == n.cfg.Mode &&
		o.cfg.ReqID == n.cfg.ReqID && o.cfg.IfID == n.cfg.IfID && o.cfg.ReplayWindow == n.cfg.ReplayWindow
}

// samePolicy compares policies ignoring the index the SPD assigns.
func samePolicy(a, b sa.Policy) bool {
	a.Index, b.Index = 0, 0
	return a == b
}
