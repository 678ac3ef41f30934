package sa

import (
	"fmt"
	"io"
	"net/netip"
	"sync/atomic"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
	"github.com/espd/espd/packet"
)

// SA is one installed state. The data path uses Hold and Release,
// Encapsulator or Decapsulator, ReserveSeq, AllowsInner, Account and Drop;
// all are safe for concurrent use and do not allocate.
type SA struct {
	db      *DB
	spi     uint32
	dir     Direction
	suite   crypto.Suite
	reqid   uint32
	ifID    uint32
	mode    Mode
	seqMax  uint64 // last usable outbound sequence number
	addSeq  uint64 // add order in the DB
	addTime int64  // mono()

	params atomic.Pointer[params]
	enc    atomic.Pointer[esp.Encapsulator]
	dec    atomic.Pointer[esp.Decapsulator]
	state  atomic.Uint32

	transform crypto.Transform // zeroed when dead and not held (hold.go)

	// fp identifies the state's keys (the state keeps no copy of them:
	// only its transform holds them); key is the DB's record of the
	// states keyed with fp (seqkeys.go).
	fp  crypto.Fingerprint
	key *keyEntry
	// inRecorded: the SeqStore counts this inbound state (Inbound), so
	// its removal calls RetireInbound. Guarded by db.keying.
	inRecorded bool

	// Guarded by db.sadb.mu, set when an outbound state is removed
	// (sealSeq): the last sequence number it handed out and its durable
	// reservation at that moment.
	seqFinal, seqSealed uint64

	// installedAt is the state's index in the DB's installed list
	// (guarded by db.sadb.mu); final holds its counters as removal read
	// them, published once it is dead (DB.Stats).
	installedAt int
	final       atomic.Pointer[totals]

	// Hot fields, each group on its own cache line: the data path holds
	// and releases the state, reserves sequence numbers (outbound), then
	// accounts, once per batch.
	_        cacheLinePad
	refs     atomic.Uint64 // Hold count; refDead once removed
	_        cacheLinePad
	seqUsed  atomic.Uint64 // last sequence number handed out
	seqLimit atomic.Uint64 // durable reservation (SeqStore): seqUsed never passes it; 0 once removed
	seqExtAt atomic.Uint64 // seqUsed from which the reservation is extended
	seqExt   atomic.Bool   // an extension is under way
	silent   atomic.Bool   // hands out no number: a standby's (SetStandby)
	pairNode int           // Options.PairNode, 0 for a state of this node alone (PairLocal)
	_        cacheLinePad
	packets  atomic.Uint64
	bytes    atomic.Uint64
	firstUse atomic.Int64 // mono(); 0: never used
	lastUse  atomic.Int64 // mono(); 0: never used

	mappingAt atomic.Int64 // mono() of the last mapping event; 0: none
	_         cacheLinePad
	drops     [NumDropReasons]atomic.Uint64
}

// params is the part of a state that UpdateSA replaces, published whole.
type params struct {
	cfg Config // keys nil
}

// SPI returns the state's SPI.
func (s *SA) SPI() uint32 { return s.spi }

// Dir returns DirIn or DirOut.
func (s *SA) Dir() Direction { return s.dir }

// Dst returns the state's outer destination address.
func (s *SA) Dst() netip.Addr { return s.params.Load().cfg.Dst }

// Addrs returns the state's outer source and destination addresses
// (Config.Src and Dst, unmapped): for a transport-mode state, the two
// hosts whose packets it carries.
func (s *SA) Addrs() (src, dst netip.Addr) {
	c := &s.params.Load().cfg
	return c.Src, c.Dst
}

// Mode returns the state's mode (Config.Mode).
func (s *SA) Mode() Mode { return s.mode }

// ReqID returns the state's reqid.
func (s *SA) ReqID() uint32 { return s.reqid }

// IfID returns the state's interface ID (Config.IfID).
func (s *SA) IfID() uint32 { return s.ifID }

// Suite returns the state's algorithms.
func (s *SA) Suite() crypto.Suite { return s.suite }

// Config returns the state's configuration without keys (EncKey and
// IntegKey are nil), with a Selectors slice of its own.
func (s *SA) Config() Config {
	c := s.params.Load().cfg
	c.Selectors = append([]Selector(nil), c.Selectors...)
	return c
}

// State returns where the state is in its life.
func (s *SA) State() State { return State(s.state.Load()) }

// Alive reports whether the state is installed and usable: valid or
// soft-expired.
func (s *SA) Alive() bool {
	st := s.State()
	return st == StateValid || st == StateSoftExpired
}

// Encapsulator returns the state's encapsulator (DirOut; nil for DirIn).
// UpdateSA publishes a new one, so the data path should fetch it once per
// batch rather than keep it. Its transform may be used only while the
// state is held (Hold).
func (s *SA) Encapsulator() *esp.Encapsulator { return s.enc.Load() }

// Decapsulator returns the state's decapsulator (DirIn; nil for DirOut),
// whose ReplayWindow survives UpdateSA. Its transform may be used only
// while the state is held (Hold).
func (s *SA) Decapsulator() *esp.Decapsulator { return s.dec.Load() }

// AllowsInner reports whether an inner packet with this flow may travel
// through the state: whether a selector of the state matches it (any
// packet if it has none). For an inbound state the selectors' Src is the
// remote network. The data path drops and counts (DropSelector) the
// packets it refuses.
func (s *SA) AllowsInner(f packet.Flow) bool {
	sels := s.params.Load().cfg.Selectors
	if len(sels) == 0 {
		return true
	}
	for i := range sels {
		if sels[i].Match(f) {
			return true
		}
	}
	return false
}

// ReserveSeq hands out up to n consecutive outbound sequence numbers,
// first to first+granted-1. Sequence numbers never cycle: a state stops at
// 2^32-1, or 2^64-1 with ESN, and goes dead with a hard-expire event
// (ExpireSequence) when it hands out the last one; after that, and for a
// dead or inbound state, granted is 0.
//
// It never hands out a number that the DB's SeqStore has not recorded as
// reserved: when use crosses half of the reserved block it extends the
// reservation in the background, and should the block run out before the
// extension is durable it grants what is left, then nothing (the data
// path drops those packets as DropSequence) until it is. A pair's node
// (Options.PairNode) grants up to the end of its block at most, and the
// rest from its next block on the next call; a silent state (SetStandby)
// grants nothing.
func (s *SA) ReserveSeq(n int) (first uint64, granted int) {
	if n <= 0 || s.dir != DirOut || s.State() == StateDead || s.silent.Load() {
		return 0, 0
	}
	for {
		used := s.seqUsed.Load()
		lim := min(s.seqLimit.Load(), s.seqMax)
		if s.pairNode != 0 && lim > used {
			// A pair's node hands out its own blocks only: skip the
			// other node's, and stop at the end of this one.
			if u := s.db.pairSkip(s.pairNode, used, lim); u != used {
				if s.seqUsed.CompareAndSwap(used, u) && u == s.seqMax {
					s.db.hardExpire(s, ExpireSequence)
				}
				continue
			}
			lim = min(lim, s.db.pairBlockEnd(used))
		}
		if lim <= used {
			if used < s.seqMax {
				s.extendSeq()
			}
			return 0, 0
		}
		g := min(uint64(n), lim-used)
		if s.seqUsed.CompareAndSwap(used, used+g) {
			if used+g == s.seqMax {
				s.db.hardExpire(s, ExpireSequence)
			} else if used+g >= s.seqExtAt.Load() {
				s.extendSeq()
			}
			return used + 1, int(g)
		}
	}
}

// Account records packets and bytes that went through the state; the data
// path calls it once per batch. It drives the byte and packet lifetimes:
// the soft limit fires one soft-expire event, the hard limit removes the
// state and fires a hard-expire event.
func (s *SA) Account(packets, bytes uint64) {
	if packets == 0 && bytes == 0 {
		return
	}
	np := s.packets.Add(packets)
	nb := s.bytes.Add(bytes)
	if s.State() == StateDead {
		s.foldLate() // counted after its removal
	}
	now := s.db.mono()
	s.lastUse.Store(now)
	if s.firstUse.Load() == 0 {
		s.firstUse.CompareAndSwap(0, now)
	}
	p := s.params.Load()
	if p.cfg.Hard.counted() {
		if r, ok := p.cfg.Hard.reached(np, nb); ok {
			s.db.hardExpire(s, r)
			return
		}
	}
	if p.cfg.Soft.counted() && s.State() == StateValid {
		if r, ok := p.cfg.Soft.reached(np, nb); ok {
			s.db.softExpire(s, r)
		}
	}
}

// Peer returns the outer address and UDP port the state's peer sends from
// (inbound) or is sent to (outbound); the port is 0 for raw ESP.
func (s *SA) Peer() netip.AddrPort {
	c := &s.params.Load().cfg
	if s.dir == DirIn {
		return netip.AddrPortFrom(c.Src, c.EncapSrcPort)
	}
	return netip.AddrPortFrom(c.Dst, c.EncapDstPort)
}

// Drop counts n packets the data path dropped for reason r (as
// DropMalformed if r is out of range).
func (s *SA) Drop(r DropReason, n uint64) {
	if r >= NumDropReasons {
		r = DropMalformed
	}
	s.drops[r].Add(n)
	if s.State() == StateDead {
		s.foldLate()
	}
}

// Stats returns a snapshot of the state's counters.
func (s *SA) Stats() Stats {
	st := Stats{
		State:    s.State(),
		Packets:  s.packets.Load(),
		Bytes:    s.bytes.Load(),
		AddTime:  s.db.wall(s.addTime),
		FirstUse: s.db.wall(s.firstUse.Load()),
		LastUse:  s.db.wall(s.lastUse.Load()),
		SeqOut:   s.seqOut(),
	}
	for i := range s.drops {
		st.Drops[i] = s.drops[i].Load()
	}
	return st
}

// ReplayTop returns the highest inbound sequence number accepted (0 for
// none, or for an outbound state).
func (s *SA) ReplayTop() uint64 {
	if d := s.dec.Load(); d != nil && d.Replay != nil {
		return d.Replay.Top()
	}
	return 0
}

// ReplayBitmap returns which numbers of an inbound state's replay window,
// counted down from ReplayTop, were received (esp.ReplayWindow.Bitmap's
// layout: bit i set when ReplayTop-i was); nil for an outbound state, a
// window that is off or one that has seen nothing.
func (s *SA) ReplayBitmap() []byte {
	if d := s.dec.Load(); d != nil && d.Replay != nil {
		return d.Replay.Bitmap()
	}
	return nil
}

// String describes the state without its keys.
func (s *SA) String() string {
	return fmt.Sprintf("%v state %v", s.params.Load().cfg, s.State())
}

// Format makes every fmt verb print String, so that no formatting of an
// SA can show its keys.
func (s *SA) Format(f fmt.State, _ rune) { io.WriteString(f, s.String()) }
