package seqstore

import (
	"fmt"

	"github.com/espd/espd/crypto"
)

// Resume returns the highest sequence number that may have been sent with
// fp (0: never used) and counts one more state using fp until its Retire.
// negotiated says that the state's keys were negotiated by an IKE daemon
// (sa.Config.Negotiated). A manual Resume of a key recorded as negotiated
// makes its record manual (kept for ever), durably before it returns; a
// negotiated Resume never makes a manual record negotiated.
func (s *Store) Resume(fp crypto.Fingerprint, negotiated bool) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return 0, err
	}
	if err := s.direction(fp, false); err != nil {
		return 0, err
	}
	e, ok := s.entries[fp]
	if ok && !negotiated && e.flags&flagNegotiated != 0 {
		r := record{kind: kindReserve, flags: e.flags &^ flagNegotiated, value: e.value, fp: fp}
		if e.retired {
			r.kind = kindRetire
		}
		if err := s.appendLocked(r); err != nil {
			return 0, err
		}
	}
	ss := s.sess[fp]
	if ss == nil {
		ss = &session{negotiated: true}
		s.sess[fp] = ss
	}
	ss.users++
	ss.floor = max(ss.floor, e.value)
	ss.negotiated = ss.negotiated && negotiated
	return e.value, nil
}

// flagsLocked returns the flags of fp's next record: those of its current
// record e (ok), or, for its first record, the origin its Resumes gave
// (manual without one).
func (s *Store) flagsLocked(fp crypto.Fingerprint, e entry, ok bool) uint8 {
	if ok {
		return e.flags
	}
	if ss := s.sess[fp]; ss != nil && ss.negotiated {
		return flagNegotiated
	}
	return 0
}

// Reserve records, durably before it returns, that sequence numbers up to
// limit may be sent with fp. A limit at or below what is recorded changes
// nothing.
func (s *Store) Reserve(fp crypto.Fingerprint, limit uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	if err := s.direction(fp, false); err != nil {
		return err
	}
	e, ok := s.entries[fp]
	r := record{kind: kindReserve, flags: s.flagsLocked(fp, e, ok), value: max(e.value, limit), fp: fp}
	if ok && !e.retired && r.value == e.value && r.flags == e.flags {
		return nil
	}
	if r.value == 0 {
		return nil
	}
	return s.appendLocked(r)
}

// Retire records that a state keyed with fp is gone after sending exactly
// up to last. When it was the last state of this process using fp (one
// Retire per Resume), the record goes down to last, so that the key, added
// again, continues right after it; while another state uses fp, or if fp
// was never resumed, it never goes down.
func (s *Store) Retire(fp crypto.Fingerprint, last uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	if err := s.direction(fp, false); err != nil {
		return err
	}
	e, ok := s.entries[fp]
	r := record{kind: kindRetire, flags: s.flagsLocked(fp, e, ok), value: max(e.value, last), fp: fp}
	ss := s.sess[fp]
	if ss != nil && ss.users > 0 {
		ss.floor = max(ss.floor, last)
		if ss.users--; ss.users > 0 {
			r.kind = kindReserve // others still send with fp
		} else {
			r.value = ss.floor
			delete(s.sess, fp)
		}
	}
	if !ok && r.value == 0 {
		return nil
	}
	if ok && r.value == e.value && r.flags == e.flags && (r.kind == kindRetire) == e.retired {
		return nil
	}
	return s.appendLocked(r)
}

// ReserveBatch is Reserve for many keys with one durable write: the
// records are appended together, synced once, and acknowledged once by
// the witness. A crash before that leaves records beyond the witness,
// whole or torn, which Open drops: the call never returned.
func (s *Store) ReserveBatch(fps []crypto.Fingerprint, limits []uint64) error {
	if len(fps) != len(limits) {
		return fmt.Errorf("seqstore: %d keys and %d limits", len(fps), len(limits))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	rs := make([]record, 0, len(fps))
	pending := make(map[crypto.Fingerprint]int, len(fps)) // fp to its record in rs
	for i, fp := range fps {
		if err := s.direction(fp, false); err != nil {
			return err
		}
		if j, ok := pending[fp]; ok {
			rs[j].value = max(rs[j].value, limits[i])
			continue
		}
		e, ok := s.entries[fp]
		r := record{kind: kindReserve, flags: s.flagsLocked(fp, e, ok), value: max(e.value, limits[i]), fp: fp}
		if (ok && !e.retired && r.value == e.value && r.flags == e.flags) || r.value == 0 {
			continue
		}
		pending[fp] = len(rs)
		rs = append(rs, r)
	}
	return s.appendBatchLocked(rs)
}

// appendBatchLocked writes rs at the end of the log with one sync of the
// log and one of the witness, then applies them.
func (s *Store) appendBatchLocked(rs []record) error {
	if len(rs) == 0 {
		return nil
	}
	if len(rs) == 1 {
		return s.appendLocked(rs[0])
	}
	clock := s.clock()
	s.lastWrite = clock
	buf := make([]byte, len(rs)*recordSize)
	for i := range rs {
		rs[i].clock = clock
		rs[i].put((*[recordSize]byte)(buf[i*recordSize:]))
	}
	if n, err := s.f.WriteAt(buf, s.size); err != nil {
		if n > 0 {
			if terr := s.f.Truncate(s.size); terr != nil {
				s.err = fmt.Errorf("seqstore: %s: write failed (%v) and the partial records could not be removed (%v)", s.path, err, terr)
			}
		}
		return fmt.Errorf("seqstore: write %s: %w", s.path, err)
	}
	if err := s.f.Sync(); err != nil {
		s.err = fmt.Errorf("seqstore: fsync %s: %w", s.path, err)
		return s.err
	}
	s.size += int64(len(buf))
	for i := range rs {
		s.count++
		s.chain = chainNext(s.chain, buf[i*recordSize:(i+1)*recordSize])
	}
	if err := s.writeHeadLocked(pair{s.count, s.chain}); err != nil {
		return err
	}
	for i, r := range rs {
		s.records++
		s.apply(r)
		if s.compacting {
			s.tail = append(s.tail, [recordSize]byte(buf[i*recordSize:]))
		}
	}
	s.maybeCompactLocked()
	return nil
}

// ReservePeer records, as Reserve does, a reservation the other node of
// a gateway pair reported (pairsync.PeerRecorder). A key this node has no
// record of and does not use gets a negotiated record, which ForgetPeer
// retires once the other node stops reporting it and which then expires
// after Options.Retain: the other node's numbers are in its own blocks,
// which this node never uses, so its record only keeps this node's
// states above the other's (no replays at the peer), never apart from a
// nonce. A record of this node's own keeps its origin.
func (s *Store) ReservePeer(fp crypto.Fingerprint, limit uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	if err := s.direction(fp, false); err != nil {
		return err
	}
	e, ok := s.entries[fp]
	flags := s.flagsLocked(fp, e, ok)
	if !ok && s.sess[fp] == nil {
		flags = flagNegotiated
	}
	r := record{kind: kindReserve, flags: flags, value: max(e.value, limit), fp: fp}
	if (ok && !e.retired && r.value == e.value && r.flags == e.flags) || r.value == 0 {
		return nil
	}
	return s.appendLocked(r)
}

// ForgetPeer retires the record of a key the other node of the pair no
// longer reports, unless a state of this node uses it or its record is
// manual: a negotiated record then expires after Options.Retain, as a
// retired negotiated key's does.
func (s *Store) ForgetPeer(fp crypto.Fingerprint) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	e, ok := s.entries[fp]
	if !ok || e.retired || e.flags&flagNegotiated == 0 || e.flags&flagInbound != 0 || s.sess[fp] != nil {
		return nil
	}
	return s.appendLocked(record{kind: kindRetire, flags: e.flags, value: e.value, fp: fp})
}
