package wire

import "github.com/espd/espd/sa"

// PutPolicy appends a policy: the POLICY_ADD and POLICY_UPDATE requests
// and the POLICY_GET reply (index is 0 in requests). MODE goes only for a
// transport-mode template: absent is tunnel.
func PutPolicy(b *Builder, p sa.Policy) {
	putSelector(b, AttrSelector, p.Selector)
	b.U32(AttrDir, dirToWire[p.Dir])
	b.U32(AttrAction, actionToWire[p.Action])
	b.U32(AttrPriority, p.Priority)
	b.U32(AttrReqID, p.ReqID)
	if p.Index != 0 {
		b.U32(AttrIndex, p.Index)
	}
	b.Addr(AttrTmplSrc, p.TmplSrc)
	b.Addr(AttrTmplDst, p.TmplDst)
	if p.Mode != sa.ModeTunnel {
		b.U32(AttrMode, modeToWire[p.Mode])
	}
	if p.IfID != 0 {
		b.U32(AttrIfID, p.IfID)
	}
}

// readPolicyDir reads a policy direction, which may be fwd.
func readPolicyDir(r *reader) (sa.Direction, bool) {
	v, ok := r.u32(AttrDir)
	if !ok {
		return 0, false
	}
	d, valid := dirFromWire(v)
	if !valid {
		r.fail(EINVAL, AttrDir, "DIR (4) of a policy must be 1 (in), 2 (out) or 3 (fwd), not %d", v)
		return 0, false
	}
	return d, true
}

// readPolicySelector reads the single SELECTOR of a policy.
func readPolicySelector(r *reader) (sa.Selector, bool) {
	v, ok := r.one(AttrSelector)
	if !ok {
		return sa.Selector{}, false
	}
	return readSelector(r, Attr{Type: AttrSelector, Value: v}), true
}

// ReadPolicy reads POLICY_ADD, POLICY_UPDATE and the POLICY_GET reply. An
// absent MODE is tunnel mode.
func ReadPolicy(attrs []Attr) (sa.Policy, error) {
	r := newReader(attrs)
	var p sa.Policy
	var ok bool
	p.Selector, ok = readPolicySelector(r)
	r.require(AttrSelector, ok)
	p.Dir, ok = readPolicyDir(r)
	r.require(AttrDir, ok)
	p.Action = sa.ActionProtect
	if v, ok := r.u32(AttrAction); ok {
		a, valid := actionFromWire(v)
		if !valid {
			r.fail(EINVAL, AttrAction, "ACTION (32) must be 1 (protect), 2 (bypass) or 3 (drop), not %d", v)
		}
		p.Action = a
	}
	p.Priority, _ = r.u32(AttrPriority)
	p.ReqID, _ = r.u32(AttrReqID)
	p.Index, _ = r.u32(AttrIndex)
	p.TmplSrc, _ = r.addr(AttrTmplSrc)
	p.TmplDst, _ = r.addr(AttrTmplDst)
	p.IfID, _ = r.u32(AttrIfID)
	if v, ok := r.u32(AttrMode); ok {
		m, valid := modeFromWire(v)
		if !valid {
			r.fail(EINVAL, AttrMode, "MODE (6) of a policy must be 1 (transport) or 2 (tunnel), not %d", v)
		}
		p.Mode = m
	}
	if p.TmplSrc.IsValid() && p.TmplDst.IsValid() && p.TmplSrc.Is4() != p.TmplDst.Is4() {
		r.fail(EINVAL, AttrTmplDst, "TMPL_SRC %v and TMPL_DST %v are of different families", p.TmplSrc, p.TmplDst)
	}
	return p, r.error()
}

// PutPolicyID appends what names a policy: its selector, direction and
// interface ID.
func PutPolicyID(b *Builder, id sa.PolicyID) {
	putSelector(b, AttrSelector, id.Selector)
	b.U32(AttrDir, dirToWire[id.Dir])
	if id.IfID != 0 {
		b.U32(AttrIfID, id.IfID)
	}
}

// ReadPolicyID reads POLICY_DEL and POLICY_GET requests.
func ReadPolicyID(attrs []Attr) (sa.PolicyID, error) {
	r := newReader(attrs)
	var id sa.PolicyID
	var ok bool
	id.Selector, ok = readPolicySelector(r)
	r.require(AttrSelector, ok)
	id.Dir, ok = readPolicyDir(r)
	r.require(AttrDir, ok)
	id.IfID, _ = r.u32(AttrIfID)
	return id, r.error()
}
