package wire

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/espd/espd/packet"
	"github.com/espd/espd/sa"
)

// EventKind is the wire value of EVENT_TYPE.
type EventKind uint32

// Event kinds.
const (
	// EventSoftExpire: a state passed a soft limit; rekey it.
	EventSoftExpire EventKind = 1
	// EventHardExpire: a state passed a hard limit and was removed.
	EventHardExpire EventKind = 2
	// EventAcquire: outbound traffic matched a protect policy whose reqid
	// has no state.
	EventAcquire EventKind = 3
	// EventMapping: the peer of a UDP-encapsulated state now sends from
	// another address or port (NAT mapping change).
	EventMapping EventKind = 4
)

// String returns "soft-expire", "hard-expire", "acquire" or "mapping".
func (k EventKind) String() string {
	switch k {
	case EventSoftExpire:
		return "soft-expire"
	case EventHardExpire:
		return "hard-expire"
	case EventAcquire:
		return "acquire"
	case EventMapping:
		return "mapping"
	}
	return fmt.Sprintf("event(%d)", uint32(k))
}

// EventMask selects event kinds: bit 1<<kind per kind.
type EventMask uint32

// AllEvents selects every event kind.
const AllEvents EventMask = 1<<EventSoftExpire | 1<<EventHardExpire | 1<<EventAcquire | 1<<EventMapping

// MaskOf returns the mask that selects the kinds given (all if none).
func MaskOf(kinds ...EventKind) EventMask {
	if len(kinds) == 0 {
		return AllEvents
	}
	var m EventMask
	for _, k := range kinds {
		if k < 32 {
			m |= 1 << k
		}
	}
	return m
}

// Has reports whether m selects k.
func (m EventMask) Has(k EventKind) bool { return k < 32 && m&(1<<k) != 0 }

// Event is an EVENT message.
type Event struct {
	Kind EventKind
	// SPI, Dst, Dir and ReqID name the state of an expire or mapping
	// event; for an acquire, ReqID and Dir are the policy's.
	SPI    uint32
	Dst    netip.Addr
	Dir    sa.Direction
	ReqID  uint32
	Reason sa.ExpireReason // expire events
	Time   time.Time
	// Policy and Flow are what an acquire is about: the protect policy
	// that matched and the packet's flow.
	Policy sa.Policy
	Flow   packet.Flow
	// NewAddr is the peer's new address and port (mapping events).
	NewAddr netip.AddrPort
	// Lost is how many events were dropped for this subscriber, because
	// it did not read them fast enough, since the previous one it got.
	Lost uint64
}

// String describes the event on one line.
func (e Event) String() string {
	var s string
	switch e.Kind {
	case EventAcquire:
		s = fmt.Sprintf("acquire reqid %d flow %v:%d -> %v:%d proto %d policy [%v]",
			e.ReqID, e.Flow.Src, e.Flow.SrcPort, e.Flow.Dst, e.Flow.DstPort, e.Flow.Proto, e.Policy)
	case EventMapping:
		s = fmt.Sprintf("mapping spi 0x%08x dst %v reqid %d: peer now %v", e.SPI, e.Dst, e.ReqID, e.NewAddr)
	default:
		s = fmt.Sprintf("%v spi 0x%08x dst %v dir %v reqid %d: %v", e.Kind, e.SPI, e.Dst, e.Dir, e.ReqID, e.Reason)
	}
	if e.Lost != 0 {
		s += fmt.Sprintf(" (%d events lost before this one)", e.Lost)
	}
	return s
}

// EventFromSA converts an sa.Event.
func EventFromSA(e sa.Event) Event {
	ev := Event{SPI: e.SPI, Dst: e.Dst, Dir: e.Dir, ReqID: e.ReqID, Reason: e.Reason, Time: e.Time}
	switch e.Kind {
	case sa.EventSoftExpire:
		ev.Kind = EventSoftExpire
	case sa.EventHardExpire:
		ev.Kind = EventHardExpire
	case sa.EventAcquire:
		ev.Kind = EventAcquire
		ev.Policy, ev.Flow = e.Policy, e.Flow
		ev.SPI, ev.Reason = 0, 0
	case sa.EventMapping:
		ev.Kind = EventMapping
		ev.NewAddr = e.NewPeer
		ev.Reason = 0
	default:
		ev.Kind = EventKind(0x100 + uint32(e.Kind))
	}
	return ev
}

// PutEvent appends the attributes of an EVENT message.
func PutEvent(b *Builder, e Event) {
	b.U32(AttrEventType, uint32(e.Kind))
	b.U64(AttrEventTime, timeToWire(e.Time))
	if e.Lost != 0 {
		b.U64(AttrEventsLost, e.Lost)
	}
	switch e.Kind {
	case EventSoftExpire, EventHardExpire:
		b.U32(AttrSPI, e.SPI)
		b.Addr(AttrDst, e.Dst)
		b.U32(AttrDir, dirToWire[e.Dir])
		b.U32(AttrReqID, e.ReqID)
		b.U32(AttrProto, ProtoESP)
		if w, ok := reasonToWire[e.Reason]; ok {
			b.U32(AttrExpireReason, w)
		}
	case EventAcquire:
		PutPolicy(b, e.Policy)
		b.Nest(AttrFlow)
		b.Addr(FlSrc, e.Flow.Src)
		b.Addr(FlDst, e.Flow.Dst)
		b.U32(FlProto, uint32(e.Flow.Proto))
		b.U16Pair(FlPorts, e.Flow.SrcPort, e.Flow.DstPort)
		b.End()
	case EventMapping:
		b.U32(AttrSPI, e.SPI)
		b.Addr(AttrDst, e.Dst)
		b.U32(AttrProto, ProtoESP)
		if e.ReqID != 0 {
			b.U32(AttrReqID, e.ReqID)
		}
		b.Addr(AttrNewAddr, e.NewAddr.Addr())
		b.U32(AttrNewPort, uint32(e.NewAddr.Port()))
	}
}

// ReadEvent reads an EVENT message. Unknown event kinds are returned with
// their kind and common fields only.
func ReadEvent(attrs []Attr) (Event, error) {
	r := newReader(attrs)
	var e Event
	k, ok := r.u32(AttrEventType)
	r.require(AttrEventType, ok)
	e.Kind = EventKind(k)
	e.Time = readTime(r, AttrEventTime)
	e.Lost, _ = r.u64(AttrEventsLost)
	if r.err != nil {
		return Event{}, r.error()
	}
	switch e.Kind {
	case EventSoftExpire, EventHardExpire:
		e.SPI, e.Dst = readStateID(r)
		if v, ok := r.u32(AttrDir); ok {
			d, valid := dirFromWire(v)
			if !valid {
				r.fail(EINVAL, AttrDir, "DIR (4): unknown direction %d", v)
			}
			e.Dir = d
		}
		e.ReqID, _ = r.u32(AttrReqID)
		if v, ok := r.u32(AttrExpireReason); ok {
			reason, valid := reasonFromWire(v)
			if !valid {
				r.fail(EINVAL, AttrExpireReason, "EXPIRE_REASON (73): unknown reason %d", v)
			}
			e.Reason = reason
		}
	case EventAcquire:
		p, err := ReadPolicy(attrs)
		if err != nil {
			return Event{}, err
		}
		e.Policy, e.Dir, e.ReqID = p, p.Dir, p.ReqID
		n, ok := r.nest(AttrFlow, spaceFlow)
		r.require(AttrFlow, ok)
		if ok {
			e.Flow.Src, _ = n.addr(FlSrc)
			e.Flow.Dst, _ = n.addr(FlDst)
			proto, _ := n.u32max(FlProto, 255)
			e.Flow.Proto = uint8(proto)
			e.Flow.SrcPort, e.Flow.DstPort, _ = n.pair(FlPorts)
			r.absorb(n)
		}
		e.Dst = e.Flow.Dst
	case EventMapping:
		e.SPI, e.Dst = readStateID(r)
		e.ReqID, _ = r.u32(AttrReqID)
		a, ok := r.addr(AttrNewAddr)
		r.require(AttrNewAddr, ok)
		port, ok := r.u32max(AttrNewPort, 0xFFFF)
		r.require(AttrNewPort, ok)
		e.NewAddr = netip.AddrPortFrom(a, uint16(port))
	}
	return e, r.error()
}

// PutSubscribe appends the attributes of a SUBSCRIBE request: the kinds of
// events wanted.
func PutSubscribe(b *Builder, mask EventMask) {
	b.U32(AttrEventMask, uint32(mask))
}

// ReadSubscribe reads a SUBSCRIBE request: the kinds of events wanted,
// every kind without EVENT_MASK.
func ReadSubscribe(attrs []Attr) (EventMask, error) {
	r := newReader(attrs)
	mask := AllEvents
	if v, ok := r.u32(AttrEventMask); ok {
		mask = EventMask(v)
	}
	return mask, r.error()
}
