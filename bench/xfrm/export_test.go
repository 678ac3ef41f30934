package xfrm

import "github.com/vishvananda/netlink"

// Test-only API: what the tests inspect and the harness does not.

// XfrmStateList lists the states of a family (netlink.FAMILY_ALL for all).
func (h NodeHandle) XfrmStateList(family int) ([]netlink.XfrmState, error) {
	var out []netlink.XfrmState
	err := h.do(func() error {
		var err error
		out, err = netlink.XfrmStateList(family)
		return err
	})
	return out, err
}

// XfrmPolicyList lists the policies of a family.
func (h NodeHandle) XfrmPolicyList(family int) ([]netlink.XfrmPolicy, error) {
	var out []netlink.XfrmPolicy
	err := h.do(func() error {
		var err error
		out, err = netlink.XfrmPolicyList(family)
		return err
	})
	return out, err
}
