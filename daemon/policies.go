package daemon

import (
	"errors"
	"fmt"

	"github.com/espd/espd/sa"
)

// policyRouter routes the traffic of policies: *policyRoutes, or a
// fake in tests that makes a step fail.
type policyRouter interface {
	// InstallPolicyRoute takes the route references a policy needs.
	InstallPolicyRoute(sa.Policy) error
	// RemovePolicyRoute drops them.
	RemovePolicyRoute(sa.Policy) error
}

// addPolicyLocked installs a policy and its route (an outbound protect or
// drop policy routes its destination into the TUN, a bypass policy throws
// it back to the main table). The policy is removed again if its route
// cannot be installed. d.mu is held.
func (d *Daemon) addPolicyLocked(p sa.Policy) (sa.Policy, error) {
	p, err := d.db.AddPolicy(p)
	if err != nil {
		return p, err
	}
	if err := d.routes.InstallPolicyRoute(p); err != nil {
		d.db.DeletePolicy(p.ID())
		return p, fmt.Errorf("route for policy %s: %w", p.Selector, err)
	}
	return p, nil
}

// updatePolicyLocked replaces a policy (same selector and direction),
// moving its route reference when the action changes. d.mu is held.
func (d *Daemon) updatePolicyLocked(p sa.Policy) (sa.Policy, error) {
	old, ok := d.db.GetPolicy(p.ID())
	if !ok {
		return p, fmt.Errorf("policy %v: %w", p.ID(), sa.ErrNotFound)
	}
	if err := d.routes.InstallPolicyRoute(p); err != nil {
		return p, fmt.Errorf("route for policy %s: %w", p.Selector, err)
	}
	np, err := d.db.UpdatePolicy(p)
	if err != nil {
		d.routes.RemovePolicyRoute(p)
		return np, err
	}
	if err := d.routes.RemovePolicyRoute(old); err != nil {
		d.log.Warn("removing the previous route of an updated policy", "policy", old.String(), "err", err)
	}
	return np, nil
}

// deletePolicyLocked removes a policy and its route. d.mu is held.
func (d *Daemon) deletePolicyLocked(id sa.PolicyID) error {
	p, ok := d.db.GetPolicy(id)
	if !ok {
		return fmt.Errorf("policy %v: %w", id, sa.ErrNotFound)
	}
	if err := d.db.DeletePolicy(id); err != nil {
		return err
	}
	delete(d.file.policies, p.ID())
	return d.routes.RemovePolicyRoute(p)
}

// flushPoliciesLocked removes every policy and its route. d.mu is held.
func (d *Daemon) flushPoliciesLocked() error {
	var errs []error
	for _, p := range d.db.Policies() {
		errs = append(errs, d.deletePolicyLocked(p.ID()))
	}
	return errors.Join(errs...)
}
