package dataplane

import (
	"errors"
	"net/netip"

	"github.com/espd/espd/routing"
	"github.com/espd/espd/sa"
)

var (
	errNoRouter = errors.New("dataplane: no router (device not started with one)")
	any4        = netip.MustParsePrefix("0.0.0.0/0")
	any6        = netip.MustParsePrefix("::/0")
)

// policyRoutes returns the routes an outbound policy needs: its
// destination prefix (both default routes for a selector that matches any
// address of either family) and the kind, tunnel for protect and drop,
// throw for bypass. Policies of other directions need none, and neither
// do those of a route-based interface (IfID): the administrator's routes
// into the interface decide what they see.
func (d *Device) policyRoutes(p sa.Policy) ([]netip.Prefix, routing.Kind) {
	if p.Dir != sa.DirOut || p.IfID != 0 {
		return nil, 0
	}
	kind := routing.Tunnel
	if p.Action == sa.ActionBypass {
		kind = routing.Throw
	}
	switch {
	case p.Dst.IsValid():
		return []netip.Prefix{p.Dst.Masked()}, kind
	case p.Src.IsValid() && p.Src.Addr().Is4():
		return []netip.Prefix{any4}, kind
	case p.Src.IsValid():
		return []netip.Prefix{any6}, kind
	case d.cfg.NoIPv6:
		return []netip.Prefix{any4}, kind
	}
	return []netip.Prefix{any4, any6}, kind
}

// InstallPolicyRoute routes the traffic of an outbound policy: into the
// TUN for protect and drop policies, back to the main table (throw) for
// bypass policies. Routes are reference-counted per prefix, so policies
// that share a destination each install and remove their own reference.
// Policies of other directions need no route and are ignored.
//
// A protect or drop policy's prefix is also held (routing's package doc):
// if espd dies or stops, its traffic is dropped, not routed in clear,
// until the policy's owner removes it with RemovePolicyRoute.
func (d *Device) InstallPolicyRoute(p sa.Policy) error {
	prefixes, kind := d.policyRoutes(p)
	if len(prefixes) == 0 {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.io.Router == nil || d.closed {
		return errNoRouter
	}
	for i, pfx := range prefixes {
		if err := d.io.Router.AddRoute(pfx, kind); err != nil {
			for _, done := range prefixes[:i] {
				d.io.Router.RemoveRoute(done, kind)
			}
			return err
		}
	}
	return nil
}

// RemovePolicyRoute drops the route references InstallPolicyRoute took
// for p; the last reference to a prefix releases its hold. Only the
// policy's owner removing it (espctl, the configuration file, the IKE
// daemon) calls it: a shutdown does not, so its protection outlives espd.
func (d *Device) RemovePolicyRoute(p sa.Policy) error {
	prefixes, kind := d.policyRoutes(p)
	if len(prefixes) == 0 {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.io.Router == nil || d.closed {
		return errNoRouter
	}
	var errs []error
	for _, pfx := range prefixes {
		errs = append(errs, d.io.Router.RemoveRoute(pfx, kind))
	}
	return errors.Join(errs...)
}
