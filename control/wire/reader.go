package wire

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"unicode/utf8"
)

// space names one attribute numbering, for error messages.
type space uint8

const (
	spaceTop space = iota
	spaceSelector
	spaceLifetime
	spaceSAStats
	spaceGlobalStats
	spaceFlow
)

var attrNames = [...]map[AttrType]string{
	spaceTop: {
		AttrSPI: "SPI", AttrSrc: "SRC", AttrDst: "DST", AttrDir: "DIR", AttrProto: "PROTO",
		AttrMode: "MODE", AttrReqID: "REQID", AttrAlgName: "ALG_NAME", AttrEncAlg: "ENC_ALG",
		AttrEncKeyLen: "ENC_KEYLEN", AttrEncKey: "ENC_KEY", AttrIntegAlg: "INTEG_ALG",
		AttrIntegKey: "INTEG_KEY", AttrESN: "ESN", AttrReplayWindow: "REPLAY_WINDOW",
		AttrEncap: "ENCAP", AttrSelector: "SELECTOR", AttrLifeSoft: "LIFETIME_SOFT",
		AttrLifeHard: "LIFETIME_HARD", AttrTTL: "TTL", AttrDSCP: "DSCP", AttrCopyDSCP: "COPY_DSCP",
		AttrECN: "ECN", AttrDF: "DF", AttrTFCPad: "TFC_PAD", AttrSAStats: "SA_STATS",
		AttrNewSrc: "NEW_SRC", AttrNewDst: "NEW_DST", AttrOSeq: "OSEQ", AttrReplaySeq: "REPLAY_SEQ",
		AttrReplayBitmap: "REPLAY_BITMAP", AttrNegotiated: "NEGOTIATED", AttrIfID: "IF_ID",
		AttrAction: "ACTION", AttrPriority: "PRIORITY", AttrIndex: "INDEX",
		AttrTmplSrc: "TMPL_SRC", AttrTmplDst: "TMPL_DST", AttrSPIMin: "SPI_MIN", AttrSPIMax: "SPI_MAX",
		AttrVersion: "VERSION", AttrSoftware: "SOFTWARE", AttrMaxMsgSize: "MAX_MSG_SIZE",
		AttrErrCode: "ERR_CODE", AttrErrMsg: "ERR_MSG", AttrErrType: "ERR_TYPE", AttrErrAttr: "ERR_ATTR",
		AttrGlobalStats: "GLOBAL_STATS", AttrEventType: "EVENT_TYPE", AttrExpireReason: "EXPIRE_REASON",
		AttrFlow: "FLOW", AttrNewAddr: "NEW_ADDR", AttrNewPort: "NEW_PORT", AttrEventsLost: "EVENTS_LOST",
		AttrEventTime: "EVENT_TIME", AttrEventMask: "EVENT_MASK",
		AttrIKEPorts: "IKE_PORTS", AttrIKEData: "IKE_DATA",
		AttrPairNode: "PAIR_NODE", AttrPairRole: "PAIR_ROLE", AttrPairReleased: "PAIR_RELEASED",
		AttrPairSilent: "PAIR_SILENT", AttrPairPeerHeard: "PAIR_PEER_HEARD",
	},
	spaceSelector: {SelSrc: "SEL_SRC", SelDst: "SEL_DST", SelProto: "SEL_PROTO",
		SelSrcPorts: "SEL_SRC_PORTS", SelDstPorts: "SEL_DST_PORTS"},
	spaceLifetime: {LtBytes: "LT_BYTES", LtPackets: "LT_PACKETS", LtAddTime: "LT_ADD_TIME",
		LtUseTime: "LT_USE_TIME"},
	spaceSAStats:     saStatNames,
	spaceGlobalStats: globalStatNames,
	spaceFlow:        {FlSrc: "FL_SRC", FlDst: "FL_DST", FlProto: "FL_PROTO", FlPorts: "FL_PORTS"},
}

// AttrName returns the protocol's name of attribute t with its number,
// "DIR (4)", for messages: t is a top-level attribute when in is 0, else
// one nested in attribute in (SELECTOR, LIFETIME_SOFT, ...). Unknown, it
// is "attribute 4".
func AttrName(in, t AttrType) string {
	s, ok := nestedSpaces[in]
	if !ok {
		return fmt.Sprintf("attribute %d", t)
	}
	return attrName(s, t)
}

// nestedSpaces gives the numbering of the attributes nested in each
// attribute, and the top-level one for 0.
var nestedSpaces = map[AttrType]space{
	0:               spaceTop,
	AttrSelector:    spaceSelector,
	AttrLifeSoft:    spaceLifetime,
	AttrLifeHard:    spaceLifetime,
	AttrSAStats:     spaceSAStats,
	AttrGlobalStats: spaceGlobalStats,
	AttrFlow:        spaceFlow,
}

func attrName(s space, t AttrType) string {
	if n, ok := attrNames[s][t]; ok {
		return fmt.Sprintf("%s (%d)", n, t)
	}
	return fmt.Sprintf("attribute %d", t)
}

// reader reads typed values out of one level of attributes and remembers the
// first problem. Single-valued attributes that appear twice, and known
// attributes with a value of the wrong size or range, are errors; unknown
// attributes are skipped.
type reader struct {
	attrs []Attr
	space space
	where string // "" at top level, else "in SELECTOR (17): "
	depth int
	err   *Error
}

func newReader(attrs []Attr) *reader { return &reader{attrs: attrs, space: spaceTop} }

func (r *reader) fail(code Errno, t AttrType, format string, args ...any) {
	if r.err != nil {
		return
	}
	r.err = &Error{Code: code, Msg: r.where + fmt.Sprintf(format, args...), Attr: t}
}

// one returns the value of the single attribute of type t.
func (r *reader) one(t AttrType) ([]byte, bool) {
	var v []byte
	found := false
	for _, a := range r.attrs {
		if a.Type != t {
			continue
		}
		if found {
			r.fail(EBADMSG, t, "duplicate %s", attrName(r.space, t))
			return nil, false
		}
		v, found = a.Value, true
	}
	return v, found
}

func (r *reader) sized(t AttrType, n int) ([]byte, bool) {
	v, ok := r.one(t)
	if !ok {
		return nil, false
	}
	if len(v) != n {
		r.fail(EBADMSG, t, "%s: value of %d bytes, want %d", attrName(r.space, t), len(v), n)
		return nil, false
	}
	return v, true
}

func (r *reader) u32(t AttrType) (uint32, bool) {
	v, ok := r.sized(t, 4)
	if !ok {
		return 0, false
	}
	return binary.BigEndian.Uint32(v), true
}

// u32max reads a u32 that must not exceed max.
func (r *reader) u32max(t AttrType, max uint32) (uint32, bool) {
	v, ok := r.u32(t)
	if ok && v > max {
		r.fail(EINVAL, t, "%s: value %d out of range 0-%d", attrName(r.space, t), v, max)
		return 0, false
	}
	return v, ok
}

func (r *reader) u64(t AttrType) (uint64, bool) {
	v, ok := r.sized(t, 8)
	if !ok {
		return 0, false
	}
	return binary.BigEndian.Uint64(v), true
}

func (r *reader) boolean(t AttrType) (bool, bool) {
	v, ok := r.u32(t)
	if !ok {
		return false, false
	}
	if v > 1 {
		r.fail(EINVAL, t, "%s: boolean value %d, want 0 or 1", attrName(r.space, t), v)
		return false, false
	}
	return v == 1, true
}

func (r *reader) pair(t AttrType) (uint16, uint16, bool) {
	v, ok := r.sized(t, 4)
	if !ok {
		return 0, 0, false
	}
	return binary.BigEndian.Uint16(v), binary.BigEndian.Uint16(v[2:]), true
}

func (r *reader) addr(t AttrType) (netip.Addr, bool) {
	v, ok := r.one(t)
	if !ok {
		return netip.Addr{}, false
	}
	switch len(v) {
	case 4:
		return netip.AddrFrom4([4]byte(v)), true
	case 16:
		return netip.AddrFrom16([16]byte(v)), true
	}
	r.fail(EBADMSG, t, "%s: address of %d bytes, want 4 or 16", attrName(r.space, t), len(v))
	return netip.Addr{}, false
}

func (r *reader) prefix(t AttrType) (netip.Prefix, bool) {
	v, ok := r.one(t)
	if !ok {
		return netip.Prefix{}, false
	}
	var a netip.Addr
	switch len(v) {
	case 8:
		a = netip.AddrFrom4([4]byte(v[4:]))
	case 20:
		a = netip.AddrFrom16([16]byte(v[4:]))
	default:
		r.fail(EBADMSG, t, "%s: prefix of %d bytes, want 8 or 20", attrName(r.space, t), len(v))
		return netip.Prefix{}, false
	}
	if v[1] != 0 || v[2] != 0 || v[3] != 0 {
		r.fail(EBADMSG, t, "%s: reserved prefix bytes not zero", attrName(r.space, t))
		return netip.Prefix{}, false
	}
	if int(v[0]) > a.BitLen() {
		r.fail(EINVAL, t, "%s: prefix length %d exceeds %d", attrName(r.space, t), v[0], a.BitLen())
		return netip.Prefix{}, false
	}
	return netip.PrefixFrom(a, int(v[0])).Masked(), true
}

// str reads a UTF-8 string; one terminating NUL is stripped.
func (r *reader) str(t AttrType) (string, bool) {
	v, ok := r.one(t)
	if !ok {
		return "", false
	}
	if n := len(v); n > 0 && v[n-1] == 0 {
		v = v[:n-1]
	}
	if !utf8.Valid(v) {
		r.fail(EBADMSG, t, "%s: string is not valid UTF-8", attrName(r.space, t))
		return "", false
	}
	for _, c := range v {
		if c == 0 {
			r.fail(EBADMSG, t, "%s: string contains NUL", attrName(r.space, t))
			return "", false
		}
	}
	return string(v), true
}

// bytes returns a copy of a raw value.
func (r *reader) bytes(t AttrType) ([]byte, bool) {
	v, ok := r.one(t)
	if !ok {
		return nil, false
	}
	return append([]byte(nil), v...), true
}

// nested parses the value of attribute a as a level of attributes in space s.
func (r *reader) nested(a Attr, s space) *reader {
	n := &reader{space: s, where: r.where + "in " + attrName(r.space, a.Type) + ": ", depth: r.depth + 1}
	if r.err != nil {
		n.err = r.err
		return n
	}
	if n.depth > MaxNesting {
		r.fail(EBADMSG, a.Type, "%s: nested deeper than %d levels", attrName(r.space, a.Type), MaxNesting)
		n.err = r.err
		return n
	}
	attrs, err := ParseAttrs(a.Value)
	if err != nil {
		r.fail(EBADMSG, a.Type, "%s: %v", attrName(r.space, a.Type), err)
		n.err = r.err
		return n
	}
	n.attrs = attrs
	return n
}

// nest returns a reader over the single nested attribute of type t.
func (r *reader) nest(t AttrType, s space) (*reader, bool) {
	v, ok := r.one(t)
	if !ok {
		return nil, false
	}
	return r.nested(Attr{Type: t, Value: v}, s), true
}

// all returns every attribute of type t, in order.
func (r *reader) all(t AttrType) []Attr {
	var out []Attr
	for _, a := range r.attrs {
		if a.Type == t {
			out = append(out, a)
		}
	}
	return out
}

// absorb takes over the first error of a nested reader.
func (r *reader) absorb(n *reader) {
	if r.err == nil && n.err != nil {
		r.err = n.err
	}
}

// require records an EINVAL for a missing required attribute.
func (r *reader) require(t AttrType, present bool) {
	if !present {
		r.fail(EINVAL, t, "missing required %s", attrName(r.space, t))
	}
}

// error returns the first problem, or nil.
func (r *reader) error() error {
	if r.err == nil {
		return nil
	}
	return r.err
}
