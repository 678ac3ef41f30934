package daemon

import (
	"fmt"
	"net/netip"

	"github.com/espd/espd/control"
	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/sa"
)

// The methods below implement control.Backend: what espctl and the
// strongSwan plugin ask for through the control socket.
var _ control.Backend = (*Daemon)(nil)

// AddSA installs a state.
func (d *Daemon) AddSA(c sa.Config) error {
	defer clear(c.EncKey)
	defer clear(c.IntegKey)
	_, err := d.db.AddSA(c)
	if err == nil {
		d.warnNoInterface(c.IfID, "state", c.String())
		d.warnSlowAES(c.Suite)
	}
	return err
}

// UpdateSA changes a state's endpoints, encapsulation, lifetimes,
// selectors or outer options.
func (d *Daemon) UpdateSA(c sa.Config) error { return d.db.UpdateSA(c) }

// DeleteSA removes a state (its keys are zeroed).
func (d *Daemon) DeleteSA(spi uint32, dst netip.Addr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.db.DeleteSA(spi, dst); err != nil {
		return err
	}
	delete(d.file.sas, saKey{spi, dst})
	return nil
}

// GetSA returns a state without its keys.
func (d *Daemon) GetSA(spi uint32, dst netip.Addr) (wire.SAInfo, error) {
	s, ok := d.db.GetSA(spi, dst)
	if !ok {
		return wire.SAInfo{}, fmt.Errorf("SA 0x%08x to %s: %w", spi, dst, sa.ErrNotFound)
	}
	return wire.InfoOf(s), nil
}

// ListSAs returns every state.
func (d *Daemon) ListSAs() ([]wire.SAInfo, error) {
	states := d.db.SAs()
	infos := make([]wire.SAInfo, len(states))
	for i, s := range states {
		infos[i] = wire.InfoOf(s)
	}
	return infos, nil
}

// FlushSAs removes every state.
func (d *Daemon) FlushSAs() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.db.FlushSAs()
	clear(d.file.sas)
	return nil
}

// AddPolicy installs a policy and its route.
func (d *Daemon) AddPolicy(p sa.Policy) (sa.Policy, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	np, err := d.addPolicyLocked(p)
	if err == nil {
		d.warnNoInterfaceLocked(p.IfID, "policy", np.String())
	}
	return np, err
}

// UpdatePolicy replaces a policy and moves its route.
func (d *Daemon) UpdatePolicy(p sa.Policy) (sa.Policy, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.updatePolicyLocked(p)
}

// DeletePolicy removes a policy and its route.
func (d *Daemon) DeletePolicy(id sa.PolicyID) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.deletePolicyLocked(id)
}

// GetPolicy returns a policy.
func (d *Daemon) GetPolicy(id sa.PolicyID) (sa.Policy, error) {
	p, ok := d.db.GetPolicy(id)
	if !ok {
		return p, fmt.Errorf("policy %v: %w", id, sa.ErrNotFound)
	}
	return p, nil
}

// ListPolicies returns every policy.
func (d *Daemon) ListPolicies() ([]sa.Policy, error) { return d.db.Policies(), nil }

// FlushPolicies removes every policy and its route.
func (d *Daemon) FlushPolicies() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.flushPoliciesLocked()
}

// AllocSPI reserves an unused inbound SPI.
func (d *Daemon) AllocSPI(lo, hi uint32) (uint32, error) { return d.db.AllocSPI(lo, hi) }

// Stats returns the global counters: the SA database's, and the data
// path's drops that concern no state, each from its one home.
func (d *Daemon) Stats() (wire.GlobalStats, error) {
	st := d.dp.Stats()
	return wire.GlobalStats{GlobalStats: d.db.Stats(), InvalidSPI: st.InvalidSPI, Malformed: st.Malformed,
		PolicyDrops: st.PolicyDrops, NoState: st.NoSA, QueueDrops: st.QueueDrops}, nil
}

// Subscribe starts an event stream.
func (d *Daemon) Subscribe(buffer int) (control.Subscription, error) {
	return control.SubscribeDB(d.db, buffer), nil
}

// PairRole sets (role != 0) and reports this node's gateway-pair role.
func (d *Daemon) PairRole(role wire.PairRole) (wire.PairStatus, error) {
	if d.pair == nil {
		return wire.PairStatus{}, wire.Errorf(wire.EOPNOTSUPP, "espd runs without --pair-node: it is not one of a gateway pair")
	}
	return d.pair.Role(role)
}
