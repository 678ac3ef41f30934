package seqstore

import "github.com/espd/espd/crypto"

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
