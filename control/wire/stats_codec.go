package wire

import (
	"net/netip"
	"time"

	"github.com/espd/espd/sa"
)

// State counters (inside AttrSAStats).
const (
	StState     AttrType = 1 // u32: StateXxx
	StPackets   AttrType = 2 // u64
	StBytes     AttrType = 3 // u64
	StAddTime   AttrType = 4 // u64 ns since the Unix epoch
	StUseTime   AttrType = 5 // u64 ns since the Unix epoch of the first use, 0: never used
	StSeqOut    AttrType = 6 // u64 last outbound sequence number
	StReplayTop AttrType = 7 // u64 highest inbound sequence number accepted
	StLastUse   AttrType = 8 // u64 ns since the Unix epoch of the last use, 0: never used
	// bytes: which numbers of the inbound replay window were received,
	// bit i (byte i/8, value 1<<(i%8)) for ST_REPLAY_TOP-i; absent when
	// the window is off or has seen nothing.
	StReplayBitmap AttrType = 9
	// Drop counters, u64 each; the same numbers are used in GLOBAL_STATS.
	StDropReplay     AttrType = 16
	StDropIntegrity  AttrType = 17
	StDropPadding    AttrType = 18
	StDropMalformed  AttrType = 19
	StDropSelector   AttrType = 20
	StDropNextHeader AttrType = 21
	StDropInner      AttrType = 22
	StDropDummy      AttrType = 23
	StDropECN        AttrType = 24
	StDropSequence   AttrType = 25
	StDropTooBig     AttrType = 26
	// StDropOther is retired: it counted drops for an error sa did not
	// know, which nothing on the data path returns (sa.DropReasonOf).
	// espd no longer sends it; readers take its absence as 0, and the
	// number is not given to another counter.
	StDropOther AttrType = 27
)

// GlobalStats is what GLOBAL_STATS carries: the SA database's counters
// and the data path's drops that happen before a packet reaches a state,
// each read from the one place that counts it.
type GlobalStats struct {
	// The SA database's counters and the sums over every state.
	sa.GlobalStats
	// The data path's drops (dataplane.Stats of the same names, NoSA for
	// NoState), zero where a backend has no data path: packets whose SPI
	// no live inbound state has (GS_INVALID_SPI); outer or TUN packets
	// that cannot be parsed far enough to find their state or policy
	// (GS_MALFORMED); outbound packets an outbound drop policy discarded
	// (GS_POLICY_DROPS); outbound packets a protect policy matched while
	// its reqid had no live state, each of which calls sa.DB.Acquire
	// (GS_NO_STATE); packets dropped because the workers' queue was full
	// (GS_QUEUE_DROPS).
	InvalidSPI, Malformed, PolicyDrops, NoState, QueueDrops uint64
}

// Global counters (inside AttrGlobalStats). Attributes 1-5 are the data
// path's, the others the SA database's; 16-27 are the drop counters of
// every state summed, numbered as in SA_STATS (27 retired).
const (
	GsInvalidSPI         AttrType = 1  // u64
	GsMalformed          AttrType = 2  // u64
	GsPolicyDrops        AttrType = 3  // u64
	GsNoState            AttrType = 4  // u64
	GsQueueDrops         AttrType = 5  // u64
	GsAcquires           AttrType = 6  // u64
	GsAcquiresSuppressed AttrType = 7  // u64
	GsEventsDropped      AttrType = 8  // u64
	GsStates             AttrType = 9  // u64
	GsLarval             AttrType = 10 // u64
	GsPolicies           AttrType = 11 // u64
	GsPackets            AttrType = 12 // u64
	GsBytes              AttrType = 13 // u64
)

// dropAttrs gives the wire attribute of each drop reason.
var dropAttrs = map[sa.DropReason]AttrType{
	sa.DropReplay: StDropReplay, sa.DropIntegrity: StDropIntegrity, sa.DropPadding: StDropPadding,
	sa.DropMalformed: StDropMalformed, sa.DropSelector: StDropSelector,
	sa.DropNextHeader: StDropNextHeader, sa.DropInner: StDropInner, sa.DropDummy: StDropDummy,
	sa.DropECN: StDropECN, sa.DropSequence: StDropSequence, sa.DropTooBig: StDropTooBig,
}

var saStatNames = map[AttrType]string{
	StState: "ST_STATE", StPackets: "ST_PACKETS", StBytes: "ST_BYTES", StAddTime: "ST_ADD_TIME",
	StUseTime: "ST_USE_TIME", StSeqOut: "ST_SEQ_OUT", StReplayTop: "ST_REPLAY_TOP", StLastUse: "ST_LAST_USE",
	StReplayBitmap: "ST_REPLAY_BITMAP",
	StDropReplay:   "ST_DROP_REPLAY", StDropIntegrity: "ST_DROP_INTEGRITY",
	StDropPadding: "ST_DROP_PADDING", StDropMalformed: "ST_DROP_MALFORMED",
	StDropSelector: "ST_DROP_SELECTOR", StDropNextHeader: "ST_DROP_NEXT_HEADER",
	StDropInner: "ST_DROP_INNER", StDropDummy: "ST_DROP_DUMMY", StDropECN: "ST_DROP_ECN",
	StDropSequence: "ST_DROP_SEQUENCE", StDropTooBig: "ST_DROP_TOO_BIG", StDropOther: "ST_DROP_OTHER",
}

var globalStatNames = map[AttrType]string{
	GsInvalidSPI: "GS_INVALID_SPI", GsMalformed: "GS_MALFORMED", GsPolicyDrops: "GS_POLICY_DROPS",
	GsNoState: "GS_NO_STATE", GsQueueDrops: "GS_QUEUE_DROPS", GsAcquires: "GS_ACQUIRES",
	GsAcquiresSuppressed: "GS_ACQUIRES_SUPPRESSED", GsEventsDropped: "GS_EVENTS_DROPPED",
	GsStates: "GS_STATES", GsLarval: "GS_LARVAL", GsPolicies: "GS_POLICIES",
	GsPackets: "GS_PACKETS", GsBytes: "GS_BYTES",
	StDropReplay: "GS_DROP_REPLAY", StDropIntegrity: "GS_DROP_INTEGRITY",
	StDropPadding: "GS_DROP_PADDING", StDropMalformed: "GS_DROP_MALFORMED",
	StDropSelector: "GS_DROP_SELECTOR", StDropNextHeader: "GS_DROP_NEXT_HEADER",
	StDropInner: "GS_DROP_INNER", StDropDummy: "GS_DROP_DUMMY", StDropECN: "GS_DROP_ECN",
	StDropSequence: "GS_DROP_SEQUENCE", StDropTooBig: "GS_DROP_TOO_BIG", StDropOther: "GS_DROP_OTHER",
}

func putDrops(b *Builder, d *[sa.NumDropReasons]uint64) {
	for r := range sa.NumDropReasons {
		if t, ok := dropAttrs[r]; ok {
			b.U64(t, d[r])
		}
	}
}

func readDrops(r *reader, d *[sa.NumDropReasons]uint64) {
	for reason, t := range dropAttrs {
		d[reason], _ = r.u64(t)
	}
}

func putSACounters(b *Builder, st sa.Stats, replayTop uint64, bitmap []byte) {
	b.Nest(AttrSAStats)
	if w, ok := stateToWire[st.State]; ok {
		b.U32(StState, w)
	}
	b.U64(StPackets, st.Packets)
	b.U64(StBytes, st.Bytes)
	b.U64(StAddTime, timeToWire(st.AddTime))
	b.U64(StUseTime, timeToWire(st.FirstUse))
	b.U64(StSeqOut, st.SeqOut)
	b.U64(StReplayTop, replayTop)
	b.U64(StLastUse, timeToWire(st.LastUse))
	if len(bitmap) > 0 {
		b.Raw(StReplayBitmap, bitmap)
	}
	putDrops(b, &st.Drops)
	b.End()
}

// readTime reads a u64 of nanoseconds since the epoch.
func readTime(r *reader, t AttrType) time.Time {
	v, ok := r.u64(t)
	if !ok {
		return time.Time{}
	}
	if _, ok := durationFromWire(v); !ok {
		r.fail(EINVAL, t, "%s: %d ns overflows", attrName(r.space, t), v)
		return time.Time{}
	}
	return timeFromWire(v)
}

func readSACounters(r *reader) (sa.Stats, uint64, []byte) {
	var st sa.Stats
	if v, ok := r.u32(StState); ok {
		s, valid := stateFromWire(v)
		if !valid {
			r.fail(EINVAL, StState, "ST_STATE (1): unknown state %d", v)
		}
		st.State = s
	}
	st.Packets, _ = r.u64(StPackets)
	st.Bytes, _ = r.u64(StBytes)
	st.AddTime = readTime(r, StAddTime)
	st.FirstUse = readTime(r, StUseTime)
	st.LastUse = readTime(r, StLastUse)
	st.SeqOut, _ = r.u64(StSeqOut)
	top, _ := r.u64(StReplayTop)
	bitmap, _ := r.bytes(StReplayBitmap)
	readDrops(r, &st.Drops)
	return st, top, bitmap
}

// PutGlobalStats appends the first part of a STATS reply: GLOBAL_STATS.
func PutGlobalStats(b *Builder, g GlobalStats) {
	b.Nest(AttrGlobalStats)
	b.U64(GsInvalidSPI, g.InvalidSPI)
	b.U64(GsMalformed, g.Malformed)
	b.U64(GsPolicyDrops, g.PolicyDrops)
	b.U64(GsNoState, g.NoState)
	b.U64(GsQueueDrops, g.QueueDrops)
	b.U64(GsAcquires, g.Acquires)
	b.U64(GsAcquiresSuppressed, g.AcquiresSuppressed)
	b.U64(GsEventsDropped, g.EventsDropped)
	b.U64(GsStates, uint64(max(g.States, 0)))
	b.U64(GsLarval, uint64(max(g.Larval, 0)))
	b.U64(GsPolicies, uint64(max(g.Policies, 0)))
	b.U64(GsPackets, g.Packets)
	b.U64(GsBytes, g.Bytes)
	putDrops(b, &g.Drops)
	b.End()
}

func readGlobalCounters(r *reader) GlobalStats {
	var g GlobalStats
	g.InvalidSPI, _ = r.u64(GsInvalidSPI)
	g.Malformed, _ = r.u64(GsMalformed)
	g.PolicyDrops, _ = r.u64(GsPolicyDrops)
	g.NoState, _ = r.u64(GsNoState)
	g.QueueDrops, _ = r.u64(GsQueueDrops)
	g.Acquires, _ = r.u64(GsAcquires)
	g.AcquiresSuppressed, _ = r.u64(GsAcquiresSuppressed)
	g.EventsDropped, _ = r.u64(GsEventsDropped)
	count := func(t AttrType) int {
		v, _ := r.u64(t)
		if v > 1<<31 {
			r.fail(EINVAL, t, "%s: count %d out of range", attrName(r.space, t), v)
			return 0
		}
		return int(v)
	}
	g.States = count(GsStates)
	g.Larval = count(GsLarval)
	g.Policies = count(GsPolicies)
	g.Packets, _ = r.u64(GsPackets)
	g.Bytes, _ = r.u64(GsBytes)
	readDrops(r, &g.Drops)
	return g
}

// ReadGlobalStats reads the first part of a STATS reply.
func ReadGlobalStats(attrs []Attr) (GlobalStats, error) {
	r := newReader(attrs)
	var g GlobalStats
	n, ok := r.nest(AttrGlobalStats, spaceGlobalStats)
	r.require(AttrGlobalStats, ok)
	if ok {
		g = readGlobalCounters(n)
		r.absorb(n)
	}
	return g, r.error()
}

// PutSAStats appends one per-state part of a STATS reply: what names the
// state and its counters.
func PutSAStats(b *Builder, in SAInfo) {
	b.U32(AttrSPI, in.Config.SPI)
	b.Addr(AttrSrc, in.Config.Src)
	b.Addr(AttrDst, in.Config.Dst)
	b.U32(AttrDir, dirToWire[in.Config.Dir])
	b.U32(AttrReqID, in.Config.ReqID)
	if in.Config.IfID != 0 {
		b.U32(AttrIfID, in.Config.IfID)
	}
	putSACounters(b, in.Stats, in.ReplayTop, in.ReplayBitmap)
}

// ReadSAStats reads a per-state part of a STATS reply; of in.Config only
// SPI, Src, Dst, Dir, ReqID and IfID are filled in (an SPI reservation has
// no Dst).
func ReadSAStats(attrs []Attr) (SAInfo, error) {
	r := newReader(attrs)
	var in SAInfo
	var ok bool
	in.Config.SPI, ok = r.u32(AttrSPI)
	r.require(AttrSPI, ok)
	in.Config.Dst, _ = r.addr(AttrDst) // none for an SPI reservation
	in.Config.Src, _ = r.addr(AttrSrc)
	if v, ok := r.u32(AttrDir); ok {
		in.Config.Dir, _ = dirFromWire(v)
	}
	in.Config.ReqID, _ = r.u32(AttrReqID)
	in.Config.IfID, _ = r.u32(AttrIfID)
	if n, ok := r.nest(AttrSAStats, spaceSAStats); ok {
		in.Stats, in.ReplayTop, in.ReplayBitmap = readSACounters(n)
		r.absorb(n)
	}
	return in, r.error()
}

// ReadStatsRequest reads a STATS request: one state named by SPI and DST
// (PutSAID), one is true, or none for every state. Only one of the two is
// EINVAL.
func ReadStatsRequest(attrs []Attr) (spi uint32, dst netip.Addr, one bool, err error) {
	r := newReader(attrs)
	spi, hasSPI := r.u32(AttrSPI)
	dst, hasDst := r.addr(AttrDst)
	if err := r.error(); err != nil {
		return 0, netip.Addr{}, false, err
	}
	if hasSPI != hasDst {
		return 0, netip.Addr{}, false, &Error{Code: EINVAL, Msg: "STATS names one state with both SPI and DST, or none", Attr: AttrSPI}
	}
	return spi, dst, hasSPI, nil
}
