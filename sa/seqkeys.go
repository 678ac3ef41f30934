package sa

import (
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/espd/espd/crypto"
)

// No (key, sequence number) pair is ever sent twice: AES-GCM and
// ChaCha20-Poly1305 use the sequence number as the IV, and one repeat
// under a key gives that key away. The DB therefore knows keys by their
// fingerprint and keeps these rules:
//
//   - A key belongs to one live state at a time, whatever the direction
//     (two outbound states, or an inbound and an outbound one, with the
//     same key number their packets from the same counter space), and
//     to one direction for ever: the SeqStore records inbound keys too
//     (Inbound, before the state is installed), and a key it says served
//     the other direction is refused (after a delete, after a restart).
//   - An outbound state continues above what its key may already have
//     sent: above the SeqStore's record (Resume) for a new state, above
//     the exact last number of the state it replaces (Apply, or a re-add
//     while the old state's retirement is pending).
//   - Nothing is handed out that the SeqStore has not first recorded as
//     reserved (Reserve); the reservation grows in blocks
//     (Options.SeqBlock) from a background goroutine before use reaches
//     it, and when a state goes its exact last number is recorded
//     (Retire).
//
// Store calls for one key are serialized by its keyEntry's mu, so that
// a late call of a removed state never lowers what a newer state of the
// same key relies on. Lock order: DB.keying, then sadb.mu, then
// keyEntry.mu is never taken with sadb.mu held.

// keyEntry is the DB's record of one key fingerprint. live and retiring
// are guarded by sadb.mu.
type keyEntry struct {
	mu       sync.Mutex // serializes SeqStore calls for the key
	live     *SA        // the live state keyed with it, if any
	retiring *SA        // a removed outbound state whose Retire is pending
}

// fpString names a key fingerprint in messages: its first 8 bytes, enough
// to tell keys apart, and one-way.
func fpString(fp crypto.Fingerprint) string { return hex.EncodeToString(fp[:8]) }

// seqExtendAt returns the sequence number from which a reservation up to
// limit is extended: half a block before its end.
func (db *DB) seqExtendAt(limit uint64) uint64 {
	half := db.opts.SeqBlock / 2
	if limit < half {
		return 0
	}
	return limit - half
}

// seqNext returns the reservation that follows limit for a state that can
// number up to max: a block further, saturating at max; for a pair's node
// (Options.PairNode), the end of its first own block above limit.
func (db *DB) seqNext(node int, limit, max uint64) uint64 {
	b := db.opts.SeqBlock
	if node == 0 {
		if max-limit < b {
			return max
		}
		return limit + b
	}
	if (max-limit)/3 < b {
		return max
	}
	end := db.pairBlockEnd(limit)
	if !db.pairOwns(node, limit+1) {
		end += b
	}
	return end
}

// extendSeq starts extending the state's reservation unless an extension
// is under way. The data path calls it; it neither blocks nor allocates
// (except the goroutine, once per block).
func (s *SA) extendSeq() {
	if s.seqExt.Load() || !s.seqExt.CompareAndSwap(false, true) {
		return
	}
	go s.db.extend(s)
}

// Backoff between failed attempts to extend a reservation.
const (
	extendRetryMin = 10 * time.Millisecond
	extendRetryMax = 5 * time.Second
)

// extend extends s's reservation by a block, retrying while the store
// fails, until it succeeds or s is removed.
func (db *DB) extend(s *SA) {
	defer s.seqExt.Store(false)
	wait := extendRetryMin
	for {
		err := db.extendOnce(s)
		if err == nil {
			return
		}
		db.seqError(fmt.Errorf("sa: state spi 0x%08x: extending its sequence number reservation (it sends nothing past %d until this succeeds): %w", s.spi, s.seqLimit.Load(), err))
		time.Sleep(wait)
		wait = min(2*wait, extendRetryMax)
	}
}

// extendOnce reserves the next block for s and publishes it; nil once
// there is nothing left to do.
func (db *DB) extendOnce(s *SA) error {
	e := s.key
	e.mu.Lock()
	defer e.mu.Unlock()
	lim := s.seqLimit.Load()
	if lim == 0 || lim >= s.seqMax || s.State() == StateDead {
		return nil
	}
	// The counter can be above the reservation after FollowPeer.
	next := db.seqNext(s.pairNode, max(lim, s.seqUsed.Load()), s.seqMax)
	if err := db.seqOf(s).Reserve(s.fp, next); err != nil {
		return err
	}
	// Fails only if the state was removed meanwhile (seqLimit 0): its
	// last number is then final and the reservation unused.
	if s.seqLimit.CompareAndSwap(lim, next) {
		s.seqExtAt.Store(db.seqExtendAt(next))
	}
	return nil
}

// seqError reports a store failure the DB can only retry or ignore.
func (db *DB) seqError(err error) {
	if db.opts.SeqError != nil {
		db.opts.SeqError(err)
	}
}

// sealSeq stops an outbound state's numbering for good and records its
// exact last number (seqFinal) and its reservation (seqSealed). Called
// once, by removeLocked, with sadb.mu held. A ReserveSeq racing with it
// either completes before (its numbers count in seqFinal) or grants
// nothing: seqUsed jumps to the reservation's end, which no grant can
// pass, and the compare-and-swap of a grant that read the old value
// fails.
func (s *SA) sealSeq() {
	lim := s.seqLimit.Swap(0)
	for {
		u := s.seqUsed.Load()
		if s.seqUsed.CompareAndSwap(u, max(u, lim)) {
			s.seqFinal, s.seqSealed = u, max(u, lim)
			return
		}
	}
}

// seqOut returns the last sequence number handed out.
func (s *SA) seqOut() uint64 {
	if s.dir != DirOut {
		return 0
	}
	u := s.seqUsed.Load()
	// removeLocked marks the state dead before sealing it, so a value
	// that sealing replaced is always followed by a dead state.
	if s.State() == StateDead && s.key != nil {
		d := &s.db.sadb
		d.mu.Lock()
		u = s.seqFinal
		d.mu.Unlock()
	}
	return u
}

// startSeq sets the counter of a new outbound state: it has sent up to
// used, and may send up to limit (durable).
func (db *DB) startSeq(s *SA, used, limit uint64) {
	s.seqUsed.Store(used)
	s.seqLimit.Store(limit)
	s.seqExtAt.Store(db.seqExtendAt(limit))
}

// resumeSeq reads what s's key may have sent and reserves the first
// block above it, or above floor (Config.OSeq) if that is higher,
// durably. Called with DB.keying held for a state not yet installed whose
// key has no live or retiring state.
func (db *DB) resumeSeq(s *SA, floor uint64) error {
	if err := db.checkDirection(s); err != nil {
		return err
	}
	hw, err := db.seqOf(s).Resume(s.fp, s.params.Load().cfg.Negotiated)
	if err != nil {
		return fmt.Errorf("sa: state spi 0x%08x: cannot know which sequence numbers key %s has used: %w", s.spi, fpString(s.fp), err)
	}
	hw = max(hw, floor)
	if hw >= s.seqMax {
		return kindErrorf(ErrKeyExhausted, "sa: state spi 0x%08x: key %s has used every sequence number %v can number (up to %d); it needs a new key", s.spi, fpString(s.fp), s.suite, hw)
	}
	limit := db.seqNext(s.pairNode, hw, s.seqMax)
	if err := db.seqOf(s).Reserve(s.fp, limit); err != nil {
		return fmt.Errorf("sa: state spi 0x%08x: cannot reserve sequence numbers for key %s: %w", s.spi, fpString(s.fp), err)
	}
	db.startSeq(s, hw, limit)
	return nil
}

// checkDirection refuses s if the SeqStore says its key served the
// other direction. Called with DB.keying held.
func (db *DB) checkDirection(s *SA) error {
	out, in, err := db.seqOf(s).Used(s.fp)
	if err != nil {
		return fmt.Errorf("sa: state spi 0x%08x dir %v: cannot know in which direction key %s was used: %w", s.spi, s.dir, fpString(s.fp), err)
	}
	if s.dir == DirOut && in || s.dir == DirIn && out {
		other := DirIn
		if s.dir == DirIn {
			other = DirOut
		}
		return kindErrorf(ErrKeyReuse, "sa: state spi 0x%08x dir %v: key %s was used dir %v before (by a state since deleted, or before a restart); a key serves one direction for ever, since the other end numbers its packets under it too: use a new key: %w", s.spi, s.dir, fpString(s.fp), other, ErrKeyDirection)
	}
	return nil
}

// useInbound records, durably, that the new inbound state s uses its
// key, after checking that the key never served outbound. Options.Loopback
// DBs record nothing (their inbound states share outbound keys). Called
// with DB.keying held, before s is installed.
func (db *DB) useInbound(s *SA) error {
	if db.opts.Loopback {
		return nil
	}
	if err := db.checkDirection(s); err != nil {
		return err
	}
	if err := db.seqOf(s).Inbound(s.fp, s.params.Load().cfg.Negotiated); err != nil {
		return fmt.Errorf("sa: state spi 0x%08x dir in: cannot record key %s as inbound: %w", s.spi, fpString(s.fp), err)
	}
	s.inRecorded = true
	return nil
}

// retire records in the store that a removed state is gone: an inbound
// state's key loses a user (RetireInbound); an outbound state's exact
// last number is recorded, unless a newer state of its key took over
// meanwhile (Apply, AddSA). Called with DB.keying held and sadb.mu not
// held.
func (db *DB) retire(s *SA) {
	if s.dir == DirIn {
		if s.inRecorded {
			s.inRecorded = false
			if err := db.seqOf(s).RetireInbound(s.fp); err != nil {
				db.seqError(fmt.Errorf("sa: state spi 0x%08x: recording that its inbound key is no longer used: %w", s.spi, err))
			}
		}
		return
	}
	d := &db.sadb
	e := s.key
	d.mu.Lock()
	pending := e.retiring == s
	last := s.seqFinal
	d.mu.Unlock()
	if !pending {
		return
	}
	e.mu.Lock()
	err := db.seqOf(s).Retire(s.fp, last)
	e.mu.Unlock()
	if err != nil {
		// The reservation stays recorded: the next state of the key
		// continues above it, which costs numbers, never safety.
		db.seqError(fmt.Errorf("sa: state spi 0x%08x: recording its last sequence number %d: %w", s.spi, last, err))
	}
	d.mu.Lock()
	if e.retiring == s {
		e.retiring = nil
		if e.live == nil && d.keys[s.fp] == e {
			delete(d.keys, s.fp)
		}
	}
	d.mu.Unlock()
}

// retireAll retires the states ss. Called with DB.keying held and
// sadb.mu not held.
func (db *DB) retireAll(ss []*SA) {
	for _, s := range ss {
		db.retire(s)
	}
}

// retireLater retires s from a goroutine of its own: for removals the
// data path or the lifetime ticker make, which must not wait for the
// store.
func (db *DB) retireLater(s *SA) {
	go func() {
		db.keying.Lock()
		defer db.keying.Unlock()
		db.retire(s)
	}()
}

// reserveFloor makes the durable reservation of s's key reach above
// floor (a Config.OSeq) and returns it. holder is the state whose
// counter the key's reservation follows: s itself for an update, or the
// removed (or being removed) state that the new state s continues. If
// holder's reservation is already above floor it is returned as it is;
// else a block above floor is recorded and published on holder, so that
// holder's own extensions go on above it (a store never sees a limit
// below one it holds). It returns 0 when holder is s and s was removed
// meanwhile. Called with DB.keying held and sadb.mu not held, before the
// floor is published (raiseSeq, or commit for a state that continues
// another): no number above what the store holds is ever handed out.
func (db *DB) reserveFloor(s, holder *SA, floor uint64) (uint64, error) {
	e := holder.key
	e.mu.Lock()
	defer e.mu.Unlock()
	cur := holder.seqLimit.Load()
	if cur == 0 {
		if holder == s {
			return 0, nil
		}
		d := &db.sadb
		d.mu.Lock()
		cur = holder.seqSealed
		d.mu.Unlock()
	}
	if floor < cur {
		return cur, nil
	}
	limit := db.seqNext(s.pairNode, floor, s.seqMax)
	if err := db.seqOf(s).Reserve(s.fp, limit); err != nil {
		return 0, fmt.Errorf("sa: state spi 0x%08x: cannot reserve sequence numbers above oseq %d for key %s: %w", s.spi, floor, fpString(s.fp), err)
	}
	db.raiseLimit(holder, limit)
	return limit, nil
}

// raiseLimit raises s's published reservation to limit, never lowering
// it, unless s was removed (limit 0).
func (db *DB) raiseLimit(s *SA, limit uint64) {
	for {
		l := s.seqLimit.Load()
		if l == 0 || l >= limit {
			return
		}
		if s.seqLimit.CompareAndSwap(l, limit) {
			s.seqExtAt.Store(db.seqExtendAt(limit))
			return
		}
	}
}

// raiseSeq raises a live outbound state's counter to floor and its
// reservation to limit (recorded by reserveFloor), never lowering either.
// Called by commit; it races safely with ReserveSeq (which re-reads the
// counter after a failed compare-and-swap) and with extendOnce (whose
// compare-and-swap then fails, leaving the higher reservation).
func (db *DB) raiseSeq(s *SA, floor, limit uint64) {
	db.raiseLimit(s, limit)
	for {
		u := s.seqUsed.Load()
		if u >= floor || s.seqUsed.CompareAndSwap(u, floor) {
			return
		}
	}
}
