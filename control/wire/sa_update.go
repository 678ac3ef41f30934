package wire

import (
	"net/netip"

	"github.com/espd/espd/sa"
)

// Fields says which fields of an sa.Config an SA_UPDATE changes.
type Fields uint32

// Fields of an SA_UPDATE. FieldSrc and FieldDst travel as NEW_SRC and
// NEW_DST; the others as the attributes of SA_ADD.
const (
	FieldSrc Fields = 1 << iota
	FieldDst
	FieldDir
	FieldSuite
	FieldKeys
	FieldReplayWindow
	FieldEncap
	FieldReqID
	FieldSelectors
	FieldSoft
	FieldHard
	FieldTTL
	FieldDSCP
	FieldCopyDSCP
	FieldECN
	FieldDF
	FieldTFC
	// FieldOSeq raises an outbound state's sequence number floor (OSEQ);
	// FieldReplay merges replay state into an inbound state's window
	// (REPLAY_SEQ and REPLAY_BITMAP). Neither ever lowers anything.
	FieldOSeq
	FieldReplay
	// FieldNegotiated is NEGOTIATED (sa.Config.Negotiated). It cannot
	// change: an SA_UPDATE may carry it only with the state's own value.
	FieldNegotiated
	// FieldESN is ESN (Config.Suite.ESN), which the attributes of
	// FieldSuite include; on its own it is ESN without the algorithm.
	// Neither can change: an SA_UPDATE may carry them only with the
	// state's own values.
	FieldESN
	// FieldIfID is IF_ID (sa.Config.IfID). It cannot change: an
	// SA_UPDATE may carry it only with the state's own value.
	FieldIfID
	// FieldMode is MODE (sa.Config.Mode), tunnel or transport. It cannot
	// change: an SA_UPDATE may carry it only with the state's own value.
	FieldMode
	// FieldsAll is every field.
	FieldsAll Fields = 1<<iota - 1
)

// SAUpdate is an SA_UPDATE request: SPI and Dst name the state (Dst is its
// current destination); the fields of Config named by Fields replace the
// state's, the others keep their values.
type SAUpdate struct {
	SPI    uint32
	Dst    netip.Addr
	Config sa.Config
	Fields Fields
}

// Apply returns cur with the fields of u applied: the configuration the
// server passes to control.Backend.UpdateSA. The keys stay nil (unchanged)
// unless u carries them. FieldDSCP without FieldCopyDSCP sets a fixed DSCP
// (it turns copying off), as in SA_ADD.
func (u SAUpdate) Apply(cur sa.Config) sa.Config {
	c := cur
	n := u.Config
	f := u.Fields
	if f&FieldSrc != 0 {
		c.Src = n.Src
	}
	if f&FieldDst != 0 {
		c.Dst = n.Dst
	}
	if f&FieldDir != 0 {
		c.Dir = n.Dir
	}
	if f&FieldSuite != 0 {
		c.Suite = n.Suite
	}
	if f&FieldESN != 0 {
		c.Suite.ESN = n.Suite.ESN
	}
	c.EncKey, c.IntegKey = nil, nil
	if f&FieldKeys != 0 {
		c.EncKey, c.IntegKey = n.EncKey, n.IntegKey
	}
	if f&FieldReplayWindow != 0 {
		c.ReplayWindow = n.ReplayWindow
	}
	if f&FieldEncap != 0 {
		c.EncapSrcPort, c.EncapDstPort = n.EncapSrcPort, n.EncapDstPort
	}
	if f&FieldReqID != 0 {
		c.ReqID = n.ReqID
	}
	if f&FieldIfID != 0 {
		c.IfID = n.IfID
	}
	if f&FieldMode != 0 {
		c.Mode = n.Mode
	}
	if f&FieldSelectors != 0 {
		c.Selectors = n.Selectors
	}
	if f&FieldSoft != 0 {
		c.Soft = n.Soft
	}
	if f&FieldHard != 0 {
		c.Hard = n.Hard
	}
	if f&FieldTTL != 0 {
		c.TTL = n.TTL
	}
	if f&FieldDSCP != 0 {
		c.DSCP = n.DSCP
		c.CopyDSCP = false // a DSCP alone is a fixed one
	}
	if f&FieldCopyDSCP != 0 {
		c.CopyDSCP = n.CopyDSCP
	}
	if f&FieldECN != 0 {
		c.ECN = n.ECN
	}
	if f&FieldDF != 0 {
		c.DF = n.DF
	}
	if f&FieldTFC != 0 {
		c.TFCPadTo = n.TFCPadTo
	}
	if f&FieldOSeq != 0 {
		c.OSeq = n.OSeq
	}
	if f&FieldReplay != 0 {
		c.ReplaySeq, c.ReplayBitmap = n.ReplaySeq, n.ReplayBitmap
	}
	if f&FieldNegotiated != 0 {
		c.Negotiated = n.Negotiated
	}
	return c
}

// PutSAUpdate appends an SA_UPDATE request: the state's SPI and current
// destination, and the fields u.Fields of u.Config.
func PutSAUpdate(b *Builder, u SAUpdate) {
	PutSAID(b, u.SPI, u.Dst)
	putSAFields(b, u.Config, u.Fields, true)
}

// ReadSAUpdate reads an SA_UPDATE request.
func ReadSAUpdate(attrs []Attr) (SAUpdate, error) {
	r := newReader(attrs)
	var u SAUpdate
	var ok bool
	u.SPI, ok = r.u32(AttrSPI)
	r.require(AttrSPI, ok)
	u.Dst, ok = r.addr(AttrDst)
	r.require(AttrDst, ok)
	r.addr(AttrSrc) // the current source: checked, not needed
	u.Config.SPI = u.SPI
	u.Fields = readSAFields(r, &u.Config, true)
	return u, r.error()
}
