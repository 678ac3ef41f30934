package wire

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/espd/espd/control/wire/wiretest"
	"github.com/espd/espd/packet"
	"github.com/espd/espd/sa"
)

// The shared samples (control/wire/wiretest), under the names the tests use.
var (
	v4a, v4b, v6a, v6b = wiretest.V4A, wiretest.V4B, wiretest.V6A, wiretest.V6B

	fullConfig   = wiretest.FullConfig
	gcmConfig    = wiretest.GCMConfig
	oseqConfig   = wiretest.OSeqConfig
	replayConfig = wiretest.ReplayConfig
	fullPolicy   = wiretest.FullPolicy
	sameConfig   = wiretest.SameConfig
)

func sampleStats() sa.Stats {
	st := sa.Stats{State: sa.StateSoftExpired, Packets: 10, Bytes: 12345,
		AddTime: time.Unix(1700000000, 5), FirstUse: time.Unix(1700000100, 7), SeqOut: 11}
	for i := range st.Drops {
		st.Drops[i] = uint64(100 + i)
	}
	return st
}

func sampleGlobal() GlobalStats {
	g := GlobalStats{InvalidSPI: 1, Malformed: 2, PolicyDrops: 3, NoState: 4, QueueDrops: 5,
		GlobalStats: sa.GlobalStats{Acquires: 6, AcquiresSuppressed: 7, EventsDropped: 8, States: 9, Larval: 10, Policies: 11,
			Packets: 12, Bytes: 13}}
	for i := range g.Drops {
		g.Drops[i] = uint64(200 + i)
	}
	return g
}

func sampleEvents() []Event {
	tm := time.Unix(1700000200, 99)
	return []Event{
		{Kind: EventSoftExpire, SPI: 0xC0000001, Dst: v4b, Dir: sa.DirOut, ReqID: 3, Reason: sa.ExpireBytes, Time: tm},
		{Kind: EventHardExpire, SPI: 0xC0000002, Dst: v6b, Dir: sa.DirIn, ReqID: 4, Reason: sa.ExpireSequence, Time: tm, Lost: 17},
		{Kind: EventAcquire, Dst: v4b, Dir: sa.DirOut, ReqID: 5, Time: tm,
			Policy: sa.Policy{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.0.0/16")}, Dir: sa.DirOut,
				Action: sa.ActionProtect, ReqID: 5, Index: 9, TmplSrc: v4a, TmplDst: v4b},
			Flow: packet.Flow{Src: netip.MustParseAddr("198.18.1.5"), Dst: v4b, Proto: 6, SrcPort: 40000, DstPort: 443}},
		{Kind: EventMapping, SPI: 0xC0000003, Dst: v4a, ReqID: 6, Time: tm, NewAddr: netip.MustParseAddrPort("198.18.9.9:4501")},
	}
}

// encode builds a message with fill.
func encode(t testing.TB, typ MsgType, flags Flags, seq uint32, fill func(*Builder)) []byte {
	t.Helper()
	b := NewBuilder(Version, typ, flags, seq)
	if fill != nil {
		fill(b)
	}
	msg, err := b.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	return slices.Clone(msg)
}

// sampleMessages returns one valid message of every type, requests and
// replies, for round trips and the fuzz seed corpus.
func sampleMessages(t testing.TB) [][]byte {
	cfg := fullConfig(t)
	var out [][]byte
	add := func(typ MsgType, flags Flags, fill func(*Builder)) {
		out = append(out, encode(t, typ, flags, uint32(len(out)+1), fill))
	}
	add(MsgHello, 0, func(b *Builder) { b.U32(AttrVersion, 1) })
	add(MsgHello, FlagReply, func(b *Builder) {
		PutHelloReply(b, HelloInfo{Version: 1, Software: "espd", MaxMessageSize: MaxMessageSize})
	})
	add(MsgError, FlagReply, func(b *Builder) {
		PutError(b, &Error{Code: EPROTONOSUPPORT, Msg: "nope", Type: MsgHello, Attr: AttrVersion, Versions: []uint8{1}})
	})
	add(MsgDone, FlagReply, nil)
	add(MsgSAAdd, 0, func(b *Builder) { putSAConfig(b, cfg, true) })
	add(MsgSAAdd, 0, func(b *Builder) { putSAConfig(b, gcmConfig(t, 0x1234), true) })
	add(MsgSAUpdate, 0, func(b *Builder) {
		b.U32(AttrSPI, cfg.SPI)
		b.Addr(AttrDst, cfg.Dst)
		putSAFields(b, cfg, FieldsAll, true)
	})
	add(MsgSADel, 0, func(b *Builder) { b.U32(AttrSPI, 1); b.Addr(AttrDst, v6b) })
	add(MsgSAGet, FlagReply, func(b *Builder) { PutSAInfo(b, SAInfo{Config: cfg, Stats: sampleStats(), ReplayTop: 77}) })
	add(MsgSAList, FlagReply|FlagMulti, func(b *Builder) { PutSAInfo(b, SAInfo{Config: gcmConfig(t, 9)}) })
	add(MsgSPIAlloc, 0, func(b *Builder) { b.U32(AttrSPIMin, 0x100); b.U32(AttrSPIMax, 0x200) })
	add(MsgPolicyAdd, 0, func(b *Builder) { PutPolicy(b, fullPolicy()) })
	add(MsgPolicyDel, 0, func(b *Builder) { PutPolicyID(b, fullPolicy().ID()) })
	add(MsgStats, FlagReply|FlagMulti, func(b *Builder) { PutGlobalStats(b, sampleGlobal()) })
	add(MsgStats, FlagReply|FlagMulti, func(b *Builder) {
		PutSAStats(b, SAInfo{Config: cfg, Stats: sampleStats(), ReplayTop: 3})
	})
	add(MsgSubscribe, 0, func(b *Builder) { b.U32(AttrEventMask, uint32(AllEvents)) })
	for _, e := range sampleEvents() {
		add(MsgEvent, 0, func(b *Builder) { PutEvent(b, e) })
	}
	add(MsgIKEPacket, 0, func(b *Builder) {
		PutIKEPacket(b, netip.MustParseAddrPort("198.18.0.2:4500"), netip.MustParseAddrPort("198.18.0.1:4500"), []byte{0, 0, 0, 0, 0x11})
		b.Raw(200, []byte("ike")) // unknown: skipped
	})
	// Sequence-number settings and read-back, and below the rest (added
	// after the others: the seed corpus names messages by type and
	// position).
	add(MsgSAAdd, 0, func(b *Builder) { putSAConfig(b, oseqConfig(t), true) })
	add(MsgSAAdd, 0, func(b *Builder) { putSAConfig(b, replayConfig(t), true) })
	add(MsgSAGet, FlagReply, func(b *Builder) {
		PutSAInfo(b, SAInfo{Config: gcmConfig(t, 9), ReplayTop: 1<<32 + 100, ReplayBitmap: []byte{5, 0, 0xff, 0, 0, 0, 0, 1}})
	})
	// What the server and the client once read with the attribute reader
	// itself.
	add(MsgSPIAlloc, FlagReply, func(b *Builder) { PutSPI(b, 0xC3A5F00D) })
	add(MsgStats, 0, func(b *Builder) { PutSAID(b, cfg.SPI, cfg.Dst) })
	add(MsgIKERegister, FlagReply, func(b *Builder) { PutIKEPorts(b, 500, 4500) })
	add(MsgIKEPacket, 0, func(b *Builder) {
		PutIKEPacket(b, netip.AddrPortFrom(netip.Addr{}, 500), netip.MustParseAddrPort("[2001:db8::2]:500"), []byte{0xbb})
	})
	// Transport mode: a state, its SA_GET reply, a policy.
	add(MsgSAAdd, 0, func(b *Builder) { putSAConfig(b, wiretest.TransportConfig(t, 0x3001), true) })
	add(MsgSAGet, FlagReply, func(b *Builder) { PutSAInfo(b, SAInfo{Config: wiretest.TransportConfig(t, 0x3001)}) })
	add(MsgPolicyAdd, 0, func(b *Builder) { PutPolicy(b, wiretest.TransportPolicy()) })
	// A gateway pair's role: set, query, status.
	add(MsgPairRole, 0, func(b *Builder) { PutPairRole(b, PairRoleActive) })
	add(MsgPairRole, 0, nil)
	add(MsgPairRole, FlagReply, func(b *Builder) {
		PutPairStatus(b, PairStatus{Node: 2, Role: PairRoleStandby, Released: 3, Silent: 1, PeerHeardMs: 120})
	})
	return out
}
