package wire

import (
	"strings"
	"time"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/sa"
)

// putSuite appends the algorithm attributes: the IKEv2 IDs and the
// strongSwan-style name.
func putSuite(b *Builder, s crypto.Suite) {
	b.String(AttrAlgName, s.String())
	b.U32(AttrEncAlg, uint32(s.Encryption))
	b.U32(AttrEncKeyLen, uint32(s.KeyBits))
	if s.Integrity != crypto.AuthNone {
		b.U32(AttrIntegAlg, uint32(s.Integrity))
	}
	b.Bool(AttrESN, s.ESN)
}

func putSelector(b *Builder, t AttrType, s sa.Selector) {
	b.Nest(t)
	b.Prefix(SelSrc, s.Src)
	b.Prefix(SelDst, s.Dst)
	if s.Proto != 0 {
		b.U32(SelProto, uint32(s.Proto))
	}
	if !s.SrcPorts.Any() {
		b.U16Pair(SelSrcPorts, s.SrcPorts.Lo, s.SrcPorts.Hi)
	}
	if !s.DstPorts.Any() {
		b.U16Pair(SelDstPorts, s.DstPorts.Lo, s.DstPorts.Hi)
	}
	b.End()
}

func putLifetime(b *Builder, t AttrType, l sa.Lifetime) {
	if l == (sa.Lifetime{}) {
		return
	}
	b.Nest(t)
	if l.Bytes != 0 {
		b.U64(LtBytes, l.Bytes)
	}
	if l.Packets != 0 {
		b.U64(LtPackets, l.Packets)
	}
	if l.AddTime > 0 {
		b.U64(LtAddTime, durationToWire(l.AddTime))
	}
	if l.UseTime > 0 {
		b.U64(LtUseTime, durationToWire(l.UseTime))
	}
	b.End()
}

// readSuite reads the algorithm attributes; ok is false when there are
// none.
func readSuite(r *reader) (s crypto.Suite, ok bool) {
	name, hasName := r.str(AttrAlgName)
	enc, hasEnc := r.u32max(AttrEncAlg, 0xFFFF)
	bits, hasBits := r.u32max(AttrEncKeyLen, 0xFFFF)
	integ, hasInteg := r.u32max(AttrIntegAlg, 0xFFFF)
	esn, _ := r.boolean(AttrESN)
	if r.err != nil {
		return crypto.Suite{}, false
	}
	if !hasName && !hasEnc {
		if hasBits || hasInteg {
			r.fail(EINVAL, AttrEncAlg, "ENC_KEYLEN or INTEG_ALG given without ENC_ALG")
		}
		return crypto.Suite{}, false
	}
	var byName, byID crypto.Suite
	if hasName {
		p, err := crypto.ParseSuite(name)
		if err != nil {
			r.fail(EINVAL, AttrAlgName, "ALG_NAME %q: %v", name, err)
			return crypto.Suite{}, false
		}
		nameESN := false
		for _, tok := range strings.Split(strings.ToLower(name), "-") {
			nameESN = nameESN || tok == "esn"
		}
		p.ESN = esn || nameESN
		byName = p
	}
	if hasEnc {
		p, err := crypto.SuiteFromIDs(crypto.EncryptionID(enc), int(bits), crypto.IntegrityID(integ), esn)
		if err != nil {
			r.fail(EINVAL, AttrEncAlg, "ENC_ALG %d ENC_KEYLEN %d INTEG_ALG %d: %v", enc, bits, integ, err)
			return crypto.Suite{}, false
		}
		byID = p
		if hasName {
			byID.ESN = byName.ESN
			if byID != byName {
				r.fail(EINVAL, AttrAlgName, "ALG_NAME %q disagrees with ENC_ALG %d ENC_KEYLEN %d INTEG_ALG %d (%v)", name, enc, bits, integ, byID)
				return crypto.Suite{}, false
			}
		}
		return byID, true
	}
	return byName, true
}

func readSelector(r *reader, a Attr) sa.Selector {
	n := r.nested(a, spaceSelector)
	var s sa.Selector
	s.Src, _ = n.prefix(SelSrc)
	s.Dst, _ = n.prefix(SelDst)
	p, _ := n.u32max(SelProto, 255)
	s.Proto = uint8(p)
	s.SrcPorts.Lo, s.SrcPorts.Hi, _ = n.pair(SelSrcPorts)
	s.DstPorts.Lo, s.DstPorts.Hi, _ = n.pair(SelDstPorts)
	if n.err == nil && s.Src.IsValid() && s.Dst.IsValid() && s.Src.Addr().Is4() != s.Dst.Addr().Is4() {
		n.fail(EINVAL, SelDst, "SEL_SRC %v and SEL_DST %v are of different families", s.Src, s.Dst)
	}
	r.absorb(n)
	return s
}

func readLifetime(r *reader, t AttrType) (sa.Lifetime, bool) {
	n, ok := r.nest(t, spaceLifetime)
	if !ok {
		return sa.Lifetime{}, false
	}
	var l sa.Lifetime
	l.Bytes, _ = n.u64(LtBytes)
	l.Packets, _ = n.u64(LtPackets)
	l.AddTime = readDuration(n, LtAddTime)
	l.UseTime = readDuration(n, LtUseTime)
	r.absorb(n)
	return l, true
}

// readDuration reads a u64 of nanoseconds as a Duration.
func readDuration(r *reader, t AttrType) time.Duration {
	v, ok := r.u64(t)
	if !ok {
		return 0
	}
	d, ok := durationFromWire(v)
	if !ok {
		r.fail(EINVAL, t, "%s: %d ns overflows", attrName(r.space, t), v)
	}
	return d
}
