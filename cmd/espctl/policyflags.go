package main

import (
	"errors"
	"flag"
	"fmt"

	"github.com/espd/espd/sa"
)

// policyFlags are the flags of policy add, update, del and get.
type policyFlags struct {
	cmdFlags

	src, dst, proto, sport, dport, dir string
	ifID                               string
	action, priority, reqid            string
	tmplSrc, tmplDst                   string
	mode                               string
}

// newPolicyFlags declares the selector and direction flags, and with full
// the rest of a policy.
func newPolicyFlags(name string, full bool) *policyFlags {
	f := &policyFlags{cmdFlags: cmdFlags{fs: flag.NewFlagSet(name, flag.ContinueOnError)}}
	fs := f.fs
	fs.StringVar(&f.src, "src", "", "inner source prefix (any if absent)")
	fs.StringVar(&f.dst, "dst", "", "inner destination prefix (any if absent)")
	fs.StringVar(&f.proto, "proto", "", "IP protocol: tcp, udp, icmp, a number, or any")
	fs.StringVar(&f.sport, "sport", "", "source port or range (ICMP: type)")
	fs.StringVar(&f.dport, "dport", "", "destination port or range (ICMP: code)")
	fs.StringVar(&f.dir, "dir", "", "direction: in, out or fwd")
	fs.StringVar(&f.ifID, "if-id", "0", "interface ID (XFRM's if_id): the route-based interface the policy applies to; 0: espd's TUN")
	if full {
		fs.StringVar(&f.action, "action", "protect", "protect, bypass or drop")
		fs.StringVar(&f.priority, "priority", "0", "priority, lower wins")
		fs.StringVar(&f.reqid, "reqid", "0", "reqid of the states that protect the traffic")
		fs.StringVar(&f.tmplSrc, "tmpl-src", "", "template: outer source of the states an acquire asks for")
		fs.StringVar(&f.tmplDst, "tmpl-dst", "", "template: outer destination")
		fs.StringVar(&f.mode, "mode", "tunnel", "template: mode of the states that protect the traffic, tunnel or transport")
	}
	return f
}

// id builds what names a policy: its selector, direction and interface
// ID.
func (f *policyFlags) id() (sa.PolicyID, error) {
	var id sa.PolicyID
	var err error
	if id.Selector, id.Dir, err = f.selector(); err != nil {
		return id, err
	}
	id.IfID, err = parseU32("if-id", f.ifID)
	return id, err
}

// selector builds the selector and direction of a policy.
func (f *policyFlags) selector() (sa.Selector, sa.Direction, error) {
	var sel sa.Selector
	if !f.set["dir"] {
		return sel, 0, errors.New("a policy needs --dir in, out or fwd")
	}
	dir, err := parsePolicyDir(f.dir)
	if err != nil {
		return sel, 0, err
	}
	if sel.Src, err = parsePrefix("src", f.src); err != nil {
		return sel, 0, err
	}
	if sel.Dst, err = parsePrefix("dst", f.dst); err != nil {
		return sel, 0, err
	}
	if sel.Proto, err = parseProto(f.proto); err != nil {
		return sel, 0, err
	}
	if sel.SrcPorts, err = parsePorts("sport", f.sport); err != nil {
		return sel, 0, err
	}
	if sel.DstPorts, err = parsePorts("dport", f.dport); err != nil {
		return sel, 0, err
	}
	if (!sel.SrcPorts.Any() || !sel.DstPorts.Any()) && sel.Proto == 0 {
		return sel, 0, errors.New("ports need --proto (tcp, udp, sctp, icmp, ...)")
	}
	return sel, dir, sel.Validate()
}

// policyID parses the flags of a command that names one policy (policy
// del, policy get): its selector and direction.
func (a *app) policyID(name string, args []string) (sa.PolicyID, error) {
	f := newPolicyFlags(name, false)
	if err := a.parse(f.fs, f.parse, args); err != nil {
		return sa.PolicyID{}, err
	}
	id, err := f.id()
	if err != nil {
		return id, usageError{err}
	}
	return id, nil
}

// policy builds a whole policy.
func (f *policyFlags) policy() (sa.Policy, error) {
	var p sa.Policy
	id, err := f.id()
	if err != nil {
		return p, err
	}
	p.Selector, p.Dir, p.IfID = id.Selector, id.Dir, id.IfID
	if p.Action, err = sa.ParseAction(f.action); err != nil {
		return p, fmt.Errorf("--action %q: want protect, bypass or drop", f.action)
	}
	if p.Priority, err = parseU32("priority", f.priority); err != nil {
		return p, err
	}
	if p.ReqID, err = parseU32("reqid", f.reqid); err != nil {
		return p, err
	}
	if p.Mode, err = parseMode(f.mode); err != nil {
		return p, err
	}
	if f.tmplSrc != "" {
		if p.TmplSrc, err = parseAddr("tmpl-src", f.tmplSrc); err != nil {
			return p, err
		}
	}
	if f.tmplDst != "" {
		if p.TmplDst, err = parseAddr("tmpl-dst", f.tmplDst); err != nil {
			return p, err
		}
	}
	if p.Action == sa.ActionProtect && p.ReqID == 0 {
		return p, errors.New("a protect policy needs --reqid (the reqid of its states)")
	}
	return p, p.Validate()
}
