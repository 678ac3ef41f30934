package sa

import (
	"fmt"
	"math"

	"github.com/espd/espd/crypto"
)

// A gateway pair (Options.PairNode) shares each outbound key between two
// DBs, one per node, which must never hand out the same number: the
// sequence space is cut into blocks of Options.SeqBlock numbers, block k
// (numbers k*SeqBlock+1 to (k+1)*SeqBlock) belonging to node 1 when k is
// even and to node 2 when it is odd. A DB hands out numbers of its own
// blocks only, whatever it learns or fails to learn from the other node,
// so that even two active nodes (a split brain) repeat no number. The
// reservation recorded in the SeqStore still covers everything up to its
// limit, the other node's blocks included: it bounds what may have been
// sent with the key by either node.
//
// A standby DB (SetStandby) keeps its outbound states but hands out no
// number at all (the data path counts the drops as DropSequence) until
// Activate moves each above what the active node reported.

// pairOwns reports whether node (a state's pairNode) may hand out number
// n (n >= 1).
func (db *DB) pairOwns(node int, n uint64) bool {
	return node == 0 || ((n-1)/db.opts.SeqBlock)%2 == uint64(node-1)
}

// seqOf returns the store of s's key: LocalSeq for a state of this node
// alone (Options.PairLocal), else Seq.
func (db *DB) seqOf(s *SA) SeqStore {
	if s.pairNode == 0 && db.opts.PairNode != 0 && db.opts.LocalSeq != nil {
		return db.opts.LocalSeq
	}
	return db.opts.Seq
}

// pairSkip returns the counter to continue from instead of used: used if
// the number after it is this DB's, else the last number of the other
// node's block that follows, capped at lim (the reservation).
func (db *DB) pairSkip(node int, used, lim uint64) uint64 {
	if used >= lim || db.pairOwns(node, used+1) {
		return used
	}
	return min(db.pairBlockEnd(used), lim)
}

// pairBlockEnd returns the last number of the block holding used+1,
// 2^64-1 for the last block of the ESN space.
func (db *DB) pairBlockEnd(used uint64) uint64 {
	b := db.opts.SeqBlock
	if k := used / b; k < math.MaxUint64/b {
		return (k + 1) * b
	}
	return math.MaxUint64
}

// SetStandby makes the DB a pair's standby (on) or not. A standby's
// outbound states, those live now and those added while it stands by,
// hand out no sequence number and reserve none beyond the first block of
// their own, until Activate. SetStandby(false) does not release the
// states it silenced: Activate does, state by state.
func (db *DB) SetStandby(on bool) {
	db.keying.Lock()
	defer db.keying.Unlock()
	db.standby.Store(on)
	if !on {
		return
	}
	d := &db.sadb
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, s := range d.installed {
		if s.dir == DirOut && s.pairNode != 0 {
			s.silent.Store(true)
		}
	}
}

// Standby reports whether the DB stands by (SetStandby).
func (db *DB) Standby() bool { return db.standby.Load() }

// Silent reports whether an outbound state hands out no sequence number
// because its DB stands by or Activate could not release it.
func (s *SA) Silent() bool { return s.silent.Load() }

// Activation is what Activate did with one silent outbound state.
type Activation struct {
	SA *SA
	// Floor is the number the state continues above (the report's, or
	// its own record's if higher); 0 when refused.
	Floor uint64
	// Err says why the state stays silent (no report for its key, or
	// the store failed); nil when it was released.
	Err error
}

// SeqBatcher is a SeqStore that records many reservations with one
// durable write (pairsync.Node, seqstore.Store): Activate reserves a
// takeover's states through it, ActivateBatch at a time.
type SeqBatcher interface {
	// ReserveBatch records, durably before it returns, that numbers up
	// to limits[i] may be sent with fps[i], for every i.
	ReserveBatch(fps []crypto.Fingerprint, limits []uint64) error
}

// ActivateBatch is how many states Activate reserves with one write of a
// SeqBatcher.
const ActivateBatch = 1024

// Activate ends the DB's standby (SetStandby(false)) and releases its
// silent outbound states: report returns, for a state's key, the highest
// sequence number the other node may have reserved, and false if it
// cannot know it (no fresh report). A released state continues above
// that number (durably recorded first, ActivateBatch states per write
// when the store is a SeqBatcher) in a block of its own; a state whose
// key has no report stays silent, and gets a soft-expire event (reason
// ExpireSequence), so that its IKE daemon rekeys it.
func (db *DB) Activate(report func(fp crypto.Fingerprint) (uint64, bool)) []Activation {
	db.keying.Lock()
	defer db.keying.Unlock()
	db.standby.Store(false)
	d := &db.sadb
	d.mu.Lock()
	var silent []*SA
	for _, s := range d.installed {
		if s.dir == DirOut && s.silent.Load() && s.State() != StateDead {
			silent = append(silent, s)
		}
	}
	d.mu.Unlock()
	acts := make([]Activation, 0, len(silent))
	var batch []int // indexes into acts of states to reserve
	for _, s := range silent {
		a := Activation{SA: s}
		floor, ok := report(s.fp)
		if !ok {
			a.Err = fmt.Errorf("sa: state spi 0x%08x: no fresh report of how far key %s's sequence numbers went on the other node: it stays silent until rekeyed", s.spi, fpString(s.fp))
			db.softExpire(s, ExpireSequence)
			acts = append(acts, a)
			continue
		}
		floor = max(floor, s.seqUsed.Load())
		if floor >= s.seqMax {
			a.Err = kindErrorf(ErrKeyExhausted, "sa: state spi 0x%08x: key %s has used every sequence number (up to %d)", s.spi, fpString(s.fp), floor)
			db.softExpire(s, ExpireSequence)
			acts = append(acts, a)
			continue
		}
		a.Floor = floor
		acts = append(acts, a)
		batch = append(batch, len(acts)-1)
		if len(batch) == ActivateBatch {
			db.activateBatch(acts, batch)
			batch = batch[:0]
		}
	}
	db.activateBatch(acts, batch)
	return acts
}

// activateBatch reserves and releases the states acts[i] for i in batch
// (Floor set: the number each continues above): with one write of a
// SeqBatcher, else state by state (reserveFloor). Called with
// db.keying held: no state is added, committed or extended meanwhile (a
// silent state hands out no number).
func (db *DB) activateBatch(acts []Activation, batch []int) {
	if len(batch) == 0 {
		return
	}
	sb, ok := db.opts.Seq.(SeqBatcher)
	if !ok {
		for _, i := range batch {
			a := &acts[i]
			lim, err := db.reserveFloor(a.SA, a.SA, a.Floor)
			db.release(a, lim, err)
		}
		return
	}
	fps := make([]crypto.Fingerprint, 0, len(batch))
	limits := make([]uint64, 0, len(batch))
	lims := make([]uint64, len(batch))
	for j, i := range batch {
		s := acts[i].SA
		cur := s.seqLimit.Load()
		switch {
		case cur == 0: // removed meanwhile
		case acts[i].Floor < cur:
			lims[j] = cur
		case db.seqOf(s) != db.opts.Seq:
			lims[j], _ = db.reserveFloor(s, s, acts[i].Floor)
		default:
			lims[j] = db.seqNext(s.pairNode, acts[i].Floor, s.seqMax)
			fps, limits = append(fps, s.fp), append(limits, lims[j])
		}
	}
	var err error
	if len(fps) > 0 {
		if err = sb.ReserveBatch(fps, limits); err != nil {
			err = fmt.Errorf("sa: cannot reserve sequence numbers for %d states at a takeover: %w", len(fps), err)
		}
	}
	for j, i := range batch {
		db.release(&acts[i], lims[j], err)
	}
}

// release ends a's state's silence above a.Floor with the reservation
// lim (0: the state was removed), or records err.
func (db *DB) release(a *Activation, lim uint64, err error) {
	if err != nil {
		a.Err, a.Floor = err, 0
		return
	}
	if lim == 0 {
		a.Floor = 0
		return
	}
	db.raiseSeq(a.SA, a.Floor, lim)
	a.SA.silent.Store(false)
}

// RekeyInbound soft-expires a live inbound state (reason
// ExpireSequence: its replay state is what is lost), so that its IKE
// daemon rekeys it: a takeover does so for a state whose replay window
// no fresh report gave. It reports whether the state was soft-expired.
func (db *DB) RekeyInbound(s *SA) bool {
	if s.dir != DirIn || s.State() != StateValid {
		return false
	}
	db.softExpire(s, ExpireSequence)
	return s.State() == StateSoftExpired
}

// Fingerprint returns the fingerprint of the state's keys: what a pair's
// reports name it by.
func (s *SA) Fingerprint() crypto.Fingerprint { return s.fp }

// MergeReplay adds a replay state reported for an inbound state (top,
// and bitmap in esp.ReplayWindow.Bitmap's layout) to its window: the
// window then refuses what either refused (esp.ReplayWindow.Merge). It
// does nothing for an outbound state or one without a window.
func (s *SA) MergeReplay(top uint64, bitmap []byte) {
	if s.dir != DirIn {
		return
	}
	if d := s.dec.Load(); d != nil && d.Replay != nil {
		d.Replay.Merge(top, bitmap)
	}
}

// FollowPeer is for a split brain, both nodes of a pair active: the other
// node reports that key fp's numbers may have gone up to floor. The live,
// released outbound state of fp then continues above it: its counter is
// raised (never lowered) without a reservation, and the extension its
// next packet starts reserves this node's first own block above floor.
// So when the split heals, the node that carries the traffic numbers
// above what the other sent, and an idle node reserves nothing (the two
// do not leapfrog). It reports whether a state was raised.
func (db *DB) FollowPeer(fp crypto.Fingerprint, floor uint64) bool {
	d := &db.sadb
	d.mu.Lock()
	var s *SA
	if e := d.keys[fp]; e != nil {
		s = e.live
	}
	d.mu.Unlock()
	if s == nil || s.dir != DirOut || s.pairNode == 0 || s.silent.Load() || s.State() == StateDead {
		return false
	}
	floor = min(floor, s.seqMax)
	for {
		u := s.seqUsed.Load()
		if u >= floor {
			return false
		}
		if s.seqUsed.CompareAndSwap(u, floor) {
			break
		}
	}
	if floor == s.seqMax {
		db.hardExpire(s, ExpireSequence)
	}
	return true
}
