package wire

import "fmt"

// Wire constants of the control protocol (docs/control-protocol.md).
const (
	// Magic is the first two bytes of every message.
	Magic uint16 = 0xE5D0
	// Version is the protocol version this package speaks.
	Version uint8 = 1
	// HeaderLen is the length of the fixed message header.
	HeaderLen = 16
	// MaxMessageSize is the largest message, header included, that either
	// side sends or accepts.
	MaxMessageSize = 64 * 1024
	// AttrHeaderLen is the length of an attribute's Length and Type fields.
	AttrHeaderLen = 4
	// MaxNesting is how deep nested attributes may go.
	MaxNesting = 4
)

// SupportedVersions lists the protocol versions this package speaks.
var SupportedVersions = []uint8{Version}

// Default SPI range for SPI_ALLOC when the request gives none (the range
// strongSwan uses).
const (
	DefaultSPIMin uint32 = 0xC0000000
	DefaultSPIMax uint32 = 0xCFFFFFFF
)

// Flags are the header flag bits.
type Flags uint8

// Header flags.
const (
	// FlagReply marks a message sent in answer to a request; its sequence
	// number is the request's.
	FlagReply Flags = 0x01
	// FlagMulti marks one part of a multi-part reply; the parts end with
	// a DONE message (or an ERROR).
	FlagMulti Flags = 0x02
)

// MsgType is the Message Type field of the header.
type MsgType uint16

// Message types.
const (
	MsgHello    MsgType = 0x0001
	MsgError    MsgType = 0x0002
	MsgDone     MsgType = 0x0003
	MsgEvent    MsgType = 0x0004
	MsgSAAdd    MsgType = 0x0010
	MsgSAUpdate MsgType = 0x0011
	MsgSADel    MsgType = 0x0012
	MsgSAGet    MsgType = 0x0013
	MsgSAList   MsgType = 0x0014
	MsgSAFlush  MsgType = 0x0015
	MsgSPIAlloc MsgType = 0x0016

	MsgPolicyAdd    MsgType = 0x0020
	MsgPolicyUpdate MsgType = 0x0021
	MsgPolicyDel    MsgType = 0x0022
	MsgPolicyGet    MsgType = 0x0023
	MsgPolicyList   MsgType = 0x0024
	MsgPolicyFlush  MsgType = 0x0025

	MsgStats       MsgType = 0x0030
	MsgSubscribe   MsgType = 0x0031
	MsgUnsubscribe MsgType = 0x0032

	// Reserved for handing IKE packets between espd and charon; not
	// implemented in version 1 (answered with EOPNOTSUPP).
	MsgIKERegister   MsgType = 0x0040
	MsgIKEPacket     MsgType = 0x0041
	MsgIKEUnregister MsgType = 0x0042

	// A gateway pair's role (pair_codec.go).
	MsgPairRole MsgType = 0x0050
)

var msgNames = map[MsgType]string{
	MsgHello: "HELLO", MsgError: "ERROR", MsgDone: "DONE", MsgEvent: "EVENT",
	MsgSAAdd: "SA_ADD", MsgSAUpdate: "SA_UPDATE", MsgSADel: "SA_DEL", MsgSAGet: "SA_GET",
	MsgSAList: "SA_LIST", MsgSAFlush: "SA_FLUSH", MsgSPIAlloc: "SPI_ALLOC",
	MsgPolicyAdd: "POLICY_ADD", MsgPolicyUpdate: "POLICY_UPDATE", MsgPolicyDel: "POLICY_DEL",
	MsgPolicyGet: "POLICY_GET", MsgPolicyList: "POLICY_LIST", MsgPolicyFlush: "POLICY_FLUSH",
	MsgStats: "STATS", MsgSubscribe: "SUBSCRIBE", MsgUnsubscribe: "UNSUBSCRIBE",
	MsgIKERegister: "IKE_REGISTER", MsgIKEPacket: "IKE_PACKET", MsgIKEUnregister: "IKE_UNREGISTER",
	MsgPairRole: "PAIR_ROLE",
}

// String returns the protocol name of the message type.
func (t MsgType) String() string {
	if n, ok := msgNames[t]; ok {
		return n
	}
	return fmt.Sprintf("type 0x%04x", uint16(t))
}

// Reserved reports whether t lies in the range reserved for IKE packet
// hand-off (0x0040-0x004F).
func (t MsgType) Reserved() bool { return t >= 0x0040 && t <= 0x004F }

// AttrType is the Type field of an attribute. Top-level attributes share one
// numbering; each nested attribute has its own (SelXxx, LtXxx, StXxx, GsXxx,
// FlXxx).
type AttrType uint16

// Top-level attributes.
const (
	AttrSPI          AttrType = 1  // u32
	AttrSrc          AttrType = 2  // address
	AttrDst          AttrType = 3  // address
	AttrDir          AttrType = 4  // u32: DirIn, DirOut, DirFwd
	AttrProto        AttrType = 5  // u32: IPsec protocol, 50 (ESP)
	AttrMode         AttrType = 6  // u32: ModeTransport, ModeTunnel (sa.Config.Mode, sa.Policy.Mode)
	AttrReqID        AttrType = 7  // u32
	AttrAlgName      AttrType = 8  // string
	AttrEncAlg       AttrType = 9  // u32: IKEv2 transform type 1 ID
	AttrEncKeyLen    AttrType = 10 // u32: key bits without salt
	AttrEncKey       AttrType = 11 // bytes
	AttrIntegAlg     AttrType = 12 // u32: IKEv2 transform type 3 ID
	AttrIntegKey     AttrType = 13 // bytes
	AttrESN          AttrType = 14 // u32 boolean
	AttrReplayWindow AttrType = 15 // u32
	AttrEncap        AttrType = 16 // u16 source port, u16 destination port
	AttrSelector     AttrType = 17 // nested SelXxx
	AttrLifeSoft     AttrType = 18 // nested LtXxx
	AttrLifeHard     AttrType = 19 // nested LtXxx
	AttrTTL          AttrType = 20 // u32
	AttrDSCP         AttrType = 21 // u32
	AttrCopyDSCP     AttrType = 22 // u32 boolean
	AttrECN          AttrType = 23 // u32 boolean
	AttrDF           AttrType = 24 // u32: DFCopy, DFSet, DFClear
	AttrTFCPad       AttrType = 25 // u32
	AttrSAStats      AttrType = 26 // nested StXxx
	AttrNewSrc       AttrType = 27 // address (SA_UPDATE)
	AttrNewDst       AttrType = 28 // address (SA_UPDATE)
	AttrOSeq         AttrType = 29 // u64: outbound floor, the last sequence number taken as sent (sa.Config.OSeq)
	AttrReplaySeq    AttrType = 30 // u64: inbound, highest sequence number taken as received (sa.Config.ReplaySeq)
	AttrReplayBitmap AttrType = 31 // bytes: inbound, bit i set when REPLAY_SEQ-i was received (sa.Config.ReplayBitmap)

	AttrAction   AttrType = 32 // u32: ActionProtect, ActionBypass, ActionDrop
	AttrPriority AttrType = 33 // u32
	AttrIndex    AttrType = 34 // u32
	AttrTmplSrc  AttrType = 35 // address
	AttrTmplDst  AttrType = 36 // address

	AttrNegotiated AttrType = 37 // u32 boolean: the keys were negotiated by IKE (sa.Config.Negotiated)
	AttrIfID       AttrType = 38 // u32: interface ID, XFRM's if_id (sa.Config.IfID, sa.Policy.IfID)

	AttrSPIMin AttrType = 40 // u32
	AttrSPIMax AttrType = 41 // u32

	AttrVersion    AttrType = 48 // u32, repeatable
	AttrSoftware   AttrType = 49 // string
	AttrMaxMsgSize AttrType = 50 // u32

	AttrErrCode AttrType = 56 // u32 errno
	AttrErrMsg  AttrType = 57 // string
	AttrErrType AttrType = 58 // u32 message type of the failed request
	AttrErrAttr AttrType = 59 // u32 attribute type at fault

	AttrGlobalStats AttrType = 64 // nested GsXxx

	AttrEventType    AttrType = 72 // u32: EventXxx
	AttrExpireReason AttrType = 73 // u32: ReasonXxx
	AttrFlow         AttrType = 74 // nested FlXxx
	AttrNewAddr      AttrType = 75 // address
	AttrNewPort      AttrType = 76 // u32
	AttrEventsLost   AttrType = 77 // u64
	AttrEventTime    AttrType = 78 // u64 ns since the Unix epoch
	AttrEventMask    AttrType = 79 // u32 bit (1 << EventXxx) per event type
)

// Selector attributes (inside AttrSelector).
const (
	SelSrc      AttrType = 1 // prefix
	SelDst      AttrType = 2 // prefix
	SelProto    AttrType = 3 // u32, 0: any
	SelSrcPorts AttrType = 4 // u16 lo, u16 hi; 0,0: any
	SelDstPorts AttrType = 5 // u16 lo, u16 hi
)

// Lifetime attributes (inside AttrLifeSoft and AttrLifeHard). Absent or 0:
// no limit.
const (
	LtBytes   AttrType = 1 // u64
	LtPackets AttrType = 2 // u64
	LtAddTime AttrType = 3 // u64 ns after the SA was added
	LtUseTime AttrType = 4 // u64 ns after the SA was first used
)

// Flow attributes (inside AttrFlow).
const (
	FlSrc   AttrType = 1 // address
	FlDst   AttrType = 2 // address
	FlProto AttrType = 3 // u32
	FlPorts AttrType = 4 // u16 source port, u16 destination port
)

// Wire values of AttrDir.
const (
	DirIn  uint32 = 1
	DirOut uint32 = 2
	DirFwd uint32 = 3
)

// Wire values of AttrAction.
const (
	ActionProtect uint32 = 1
	ActionBypass  uint32 = 2
	ActionDrop    uint32 = 3
)

// Wire values of AttrMode: XFRM's mode of a state or policy template
// (sa.Mode). An absent MODE is tunnel mode.
const (
	ModeTransport uint32 = 1
	ModeTunnel    uint32 = 2
)

// ProtoESP is the only IPsec protocol (AttrProto) espd implements.
const ProtoESP uint32 = 50

// Wire values of AttrDF.
const (
	DFCopy  uint32 = 0
	DFSet   uint32 = 1
	DFClear uint32 = 2
)

// Wire values of AttrExpireReason: which limit was reached.
const (
	ReasonBytes   uint32 = 1
	ReasonPackets uint32 = 2
	ReasonAddTime uint32 = 3
	ReasonUseTime uint32 = 4
	ReasonSeq     uint32 = 5 // outbound sequence numbers exhausted
)

// Wire values of StState.
const (
	StateLarval      uint32 = 1
	StateValid       uint32 = 2
	StateSoftExpired uint32 = 3
	StateDead        uint32 = 4
)
