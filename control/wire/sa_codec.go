package wire

import (
	"fmt"
	"net/netip"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/sa"
)

// SAInfo is what SA_GET and SA_LIST return about a state: its
// configuration without keys and its counters.
type SAInfo struct {
	Config sa.Config // EncKey and IntegKey are always nil
	Stats  sa.Stats
	// ReplayTop is the highest inbound sequence number accepted (0 for
	// none and for outbound states).
	ReplayTop uint64
	// ReplayBitmap says which numbers of the inbound replay window were
	// received: bit i (byte i/8, value 1<<(i%8)) for ReplayTop-i (nil for
	// an outbound state, a window that is off or has seen nothing;
	// sa.SA.ReplayBitmap).
	ReplayBitmap []byte
}

// InfoOf returns the SAInfo of an installed state, for control.Backend
// implementations over sa.DB.
func InfoOf(s *sa.SA) SAInfo {
	return SAInfo{Config: s.Config(), Stats: s.Stats(), ReplayTop: s.ReplayTop(), ReplayBitmap: s.ReplayBitmap()}
}

// putSAFields appends the attributes of the fields f of c; FieldSrc and
// FieldDst as SRC and DST unless update, where they go as NEW_SRC and
// NEW_DST.
func putSAFields(b *Builder, c sa.Config, f Fields, update bool) {
	srcT, dstT := AttrSrc, AttrDst
	if update {
		srcT, dstT = AttrNewSrc, AttrNewDst
	}
	if f&FieldMode != 0 {
		b.U32(AttrMode, modeToWire[c.Mode])
	}
	if f&FieldSrc != 0 {
		b.Addr(srcT, c.Src)
	}
	if f&FieldDst != 0 {
		b.Addr(dstT, c.Dst)
	}
	if f&FieldDir != 0 {
		b.U32(AttrDir, dirToWire[c.Dir])
	}
	if f&FieldReqID != 0 {
		b.U32(AttrReqID, c.ReqID)
	}
	if f&FieldIfID != 0 && c.IfID != 0 {
		b.U32(AttrIfID, c.IfID)
	}
	switch {
	case f&FieldSuite != 0:
		if c.Suite != (crypto.Suite{}) { // an SPI reservation has none
			putSuite(b, c.Suite)
		}
	case f&FieldESN != 0:
		b.Bool(AttrESN, c.Suite.ESN)
	}
	if f&FieldKeys != 0 {
		if c.EncKey != nil {
			b.Raw(AttrEncKey, c.EncKey)
		}
		if c.IntegKey != nil {
			b.Raw(AttrIntegKey, c.IntegKey)
		}
	}
	if f&FieldReplayWindow != 0 {
		b.U32(AttrReplayWindow, c.ReplayWindow)
	}
	if f&FieldEncap != 0 {
		b.U16Pair(AttrEncap, c.EncapSrcPort, c.EncapDstPort)
	}
	if f&FieldSelectors != 0 {
		for _, s := range c.Selectors {
			putSelector(b, AttrSelector, s)
		}
	}
	if f&FieldSoft != 0 {
		putLifetime(b, AttrLifeSoft, c.Soft)
	}
	if f&FieldHard != 0 {
		putLifetime(b, AttrLifeHard, c.Hard)
	}
	if f&FieldTTL != 0 {
		b.U32(AttrTTL, uint32(c.TTL))
	}
	if f&FieldDSCP != 0 {
		b.U32(AttrDSCP, uint32(c.DSCP))
	}
	if f&FieldCopyDSCP != 0 {
		b.Bool(AttrCopyDSCP, c.CopyDSCP)
	}
	if f&FieldECN != 0 {
		b.Bool(AttrECN, c.ECN)
	}
	if f&FieldDF != 0 {
		b.U32(AttrDF, dfToWire[c.DF])
	}
	if f&FieldTFC != 0 {
		b.U32(AttrTFCPad, uint32(c.TFCPadTo))
	}
	if f&FieldOSeq != 0 {
		b.U64(AttrOSeq, c.OSeq)
	}
	if f&FieldReplay != 0 {
		b.U64(AttrReplaySeq, c.ReplaySeq)
		if len(c.ReplayBitmap) != 0 {
			b.Raw(AttrReplayBitmap, c.ReplayBitmap)
		}
	}
	if f&FieldNegotiated != 0 {
		b.Bool(AttrNegotiated, c.Negotiated)
	}
}

// putSAConfig appends a whole state: SA_ADD (with keys) or the
// configuration part of an SA_GET reply (without).
func putSAConfig(b *Builder, c sa.Config, keys bool) {
	b.U32(AttrSPI, c.SPI)
	b.U32(AttrProto, ProtoESP)
	f := FieldsAll
	if !keys {
		f &^= FieldKeys
	}
	// Sequence-number settings travel when given; a state's own are in
	// its SA_STATS.
	if c.OSeq == 0 {
		f &^= FieldOSeq
	}
	if c.ReplaySeq == 0 && len(c.ReplayBitmap) == 0 {
		f &^= FieldReplay
	}
	// Absent means manual: only negotiated states carry it.
	if !c.Negotiated {
		f &^= FieldNegotiated
	}
	putSAFields(b, c, f, false)
}

// PutSAAdd appends an SA_ADD request that carries every field of c, keys
// included.
func PutSAAdd(b *Builder, c sa.Config) { putSAConfig(b, c, true) }

// PutSAAddFields appends an SA_ADD request that carries c's SPI and the
// fields f of c; the server gives the others their defaults (without
// FieldMode, tunnel mode).
func PutSAAddFields(b *Builder, c sa.Config, f Fields) {
	b.U32(AttrSPI, c.SPI)
	b.U32(AttrProto, ProtoESP)
	putSAFields(b, c, f, false)
}

// readSAFields reads every SA attribute present into c and reports which
// fields it set; the fields of absent attributes keep the values c had
// (sa.DefaultConfig's for SA_ADD). SRC and DST are read as FieldSrc and
// FieldDst unless update, where NEW_SRC and NEW_DST are.
func readSAFields(r *reader, c *sa.Config, update bool) Fields {
	var f Fields
	srcT, dstT := AttrSrc, AttrDst
	if update {
		srcT, dstT = AttrNewSrc, AttrNewDst
	}
	if v, ok := r.addr(srcT); ok {
		c.Src = v
		f |= FieldSrc
	}
	if v, ok := r.addr(dstT); ok {
		c.Dst = v
		f |= FieldDst
	}
	if f&FieldSrc != 0 && f&FieldDst != 0 && c.Src.Is4() != c.Dst.Is4() {
		r.fail(EINVAL, dstT, "%s %v and %s %v are of different families", attrName(spaceTop, srcT), c.Src, attrName(spaceTop, dstT), c.Dst)
	}
	if v, ok := r.u32(AttrDir); ok {
		d, valid := dirFromWire(v)
		if !valid || d == sa.DirFwd {
			r.fail(EINVAL, AttrDir, "DIR (4) of a state must be 1 (in) or 2 (out), not %d", v)
		}
		c.Dir = d
		f |= FieldDir
	}
	if v, ok := r.u32(AttrProto); ok && v != ProtoESP {
		r.fail(EPROTONOSUPPORT, AttrProto, "IPsec protocol %d is not supported: espd implements ESP (50) only", v)
	}
	if v, ok := r.u32(AttrMode); ok {
		m, valid := modeFromWire(v)
		if !valid {
			r.fail(EINVAL, AttrMode, "MODE (6) of a state must be 1 (transport) or 2 (tunnel), not %d", v)
		}
		c.Mode = m
		f |= FieldMode
	}
	if v, ok := r.u32(AttrReqID); ok {
		c.ReqID = v
		f |= FieldReqID
	}
	if v, ok := r.u32(AttrIfID); ok {
		c.IfID = v
		f |= FieldIfID
	}
	if s, ok := readSuite(r); ok {
		c.Suite = s
		f |= FieldSuite
	}
	if esn, ok := r.boolean(AttrESN); ok {
		// With the algorithm readSuite took it; without, it still says
		// what ESN must be (an SA_UPDATE cannot change it).
		if f&FieldSuite == 0 {
			c.Suite.ESN = esn
		}
		f |= FieldESN
	}
	ek, hasEK := r.bytes(AttrEncKey)
	ik, hasIK := r.bytes(AttrIntegKey)
	if hasEK || hasIK {
		c.EncKey, c.IntegKey = ek, ik
		if c.EncKey == nil {
			c.EncKey = []byte{}
		}
		if c.IntegKey == nil {
			c.IntegKey = []byte{}
		}
		f |= FieldKeys
	}
	if v, ok := r.u32(AttrReplayWindow); ok {
		c.ReplayWindow = v
		f |= FieldReplayWindow
	}
	if sp, dp, ok := r.pair(AttrEncap); ok {
		c.EncapSrcPort, c.EncapDstPort = sp, dp
		f |= FieldEncap
	}
	if sels := r.all(AttrSelector); len(sels) > 0 {
		c.Selectors = nil
		for _, a := range sels {
			c.Selectors = append(c.Selectors, readSelector(r, a))
		}
		f |= FieldSelectors
	}
	if l, ok := readLifetime(r, AttrLifeSoft); ok {
		c.Soft = l
		f |= FieldSoft
	}
	if l, ok := readLifetime(r, AttrLifeHard); ok {
		c.Hard = l
		f |= FieldHard
	}
	if v, ok := r.u32max(AttrTTL, 255); ok {
		c.TTL = uint8(v)
		f |= FieldTTL
	}
	if v, ok := r.u32max(AttrDSCP, 63); ok {
		c.DSCP = uint8(v)
		f |= FieldDSCP
	}
	if v, ok := r.boolean(AttrCopyDSCP); ok {
		c.CopyDSCP = v
		f |= FieldCopyDSCP
	}
	if v, ok := r.boolean(AttrECN); ok {
		c.ECN = v
		f |= FieldECN
	}
	if v, ok := r.u32(AttrDF); ok {
		m, valid := dfFromWire(v)
		if !valid {
			r.fail(EINVAL, AttrDF, "DF (24) must be 0 (copy), 1 (set) or 2 (clear), not %d", v)
		}
		c.DF = m
		f |= FieldDF
	}
	if v, ok := r.u32max(AttrTFCPad, 65535); ok {
		c.TFCPadTo = int(v)
		f |= FieldTFC
	}
	if v, ok := r.u64(AttrOSeq); ok {
		c.OSeq = v
		f |= FieldOSeq
	}
	rs, hasRS := r.u64(AttrReplaySeq)
	bm, hasBM := r.bytes(AttrReplayBitmap)
	if hasRS || hasBM {
		c.ReplaySeq, c.ReplayBitmap = rs, bm
		f |= FieldReplay
	}
	if v, ok := r.boolean(AttrNegotiated); ok {
		c.Negotiated = v
		f |= FieldNegotiated
	}
	return f
}

// ReadSAAdd reads an SA_ADD request. What it does not carry takes
// sa.DefaultConfig's value, except that a DSCP without COPY_DSCP means a
// fixed DSCP (COPY_DSCP off).
func ReadSAAdd(attrs []Attr) (sa.Config, error) {
	r := newReader(attrs)
	c := sa.DefaultConfig()
	spi, hasSPI := r.u32(AttrSPI)
	c.SPI = spi
	f := readSAFields(r, &c, false)
	r.require(AttrSPI, hasSPI)
	r.require(AttrSrc, f&FieldSrc != 0)
	r.require(AttrDst, f&FieldDst != 0)
	r.require(AttrDir, f&FieldDir != 0)
	if r.err == nil && f&FieldSuite == 0 {
		r.fail(EINVAL, AttrAlgName, "missing algorithm: ALG_NAME (8) or ENC_ALG (9)")
	}
	if r.err == nil && f&FieldKeys == 0 {
		c.EncKey, c.IntegKey = []byte{}, []byte{}
	}
	if f&FieldDSCP != 0 && f&FieldCopyDSCP == 0 {
		c.CopyDSCP = false
	}
	return c, r.error()
}

// PutSAID appends what names a state: its SPI and destination (SA_DEL,
// SA_GET and STATS requests).
func PutSAID(b *Builder, spi uint32, dst netip.Addr) {
	b.U32(AttrSPI, spi)
	b.Addr(AttrDst, dst)
}

// ReadSAID reads the SPI and DST that name a state in an SA_DEL or SA_GET
// request; both are required.
func ReadSAID(attrs []Attr) (uint32, netip.Addr, error) {
	r := newReader(attrs)
	spi, dst := readStateID(r)
	return spi, dst, r.error()
}

// readStateID reads the SPI and DST that SA_DEL, SA_GET and the events
// name.
func readStateID(r *reader) (uint32, netip.Addr) {
	spi, ok := r.u32(AttrSPI)
	r.require(AttrSPI, ok)
	dst, ok := r.addr(AttrDst)
	r.require(AttrDst, ok)
	return spi, dst
}

// PutSAInfo appends an SA_GET reply body.
func PutSAInfo(b *Builder, in SAInfo) {
	putSAConfig(b, in.Config, false)
	putSACounters(b, in.Stats, in.ReplayTop, in.ReplayBitmap)
}

// ReadSAInfo reads an SA_GET reply body.
func ReadSAInfo(attrs []Attr) (SAInfo, error) {
	r := newReader(attrs)
	var in SAInfo
	in.Config.SPI, _ = r.u32(AttrSPI)
	readSAFields(r, &in.Config, false)
	in.Config.EncKey, in.Config.IntegKey = nil, nil
	if n, ok := r.nest(AttrSAStats, spaceSAStats); ok {
		in.Stats, in.ReplayTop, in.ReplayBitmap = readSACounters(n)
		r.absorb(n)
	}
	return in, r.error()
}

// PutSPIRange appends an SPI_ALLOC request for an SPI in [lo, hi].
func PutSPIRange(b *Builder, lo, hi uint32) {
	b.U32(AttrSPIMin, lo)
	b.U32(AttrSPIMax, hi)
}

// ReadSPIRange reads an SPI_ALLOC request: the range [lo, hi] asked for,
// DefaultSPIMin and DefaultSPIMax where it gives no bound. An empty range
// is EINVAL.
func ReadSPIRange(attrs []Attr) (lo, hi uint32, err error) {
	r := newReader(attrs)
	lo, ok := r.u32(AttrSPIMin)
	if !ok {
		lo = DefaultSPIMin
	}
	hi, ok = r.u32(AttrSPIMax)
	if !ok {
		hi = DefaultSPIMax
	}
	if err := r.error(); err != nil {
		return 0, 0, err
	}
	if lo > hi {
		return 0, 0, &Error{Code: EINVAL, Msg: fmt.Sprintf("SPI range 0x%08x-0x%08x is empty", lo, hi), Attr: AttrSPIMin}
	}
	return lo, hi, nil
}

// PutSPI appends the SPI_ALLOC reply: the SPI reserved.
func PutSPI(b *Builder, spi uint32) { b.U32(AttrSPI, spi) }

// ReadSPI reads the SPI_ALLOC reply.
func ReadSPI(attrs []Attr) (uint32, error) {
	r := newReader(attrs)
	spi, ok := r.u32(AttrSPI)
	r.require(AttrSPI, ok)
	return spi, r.error()
}
