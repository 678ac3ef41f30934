package seqstore

import (
	"errors"
	"fmt"

	"github.com/espd/espd/crypto"
)

// ErrDirection: a key used in one direction was given for the other.
var ErrDirection = errors.New("key used in the other direction")

// usedLocked reports whether fp was used (recorded, or resumed by this
// process) outbound and inbound.
func (s *Store) usedLocked(fp crypto.Fingerprint) (out, in bool) {
	if e, ok := s.entries[fp]; ok {
		out, in = e.flags&flagInbound == 0, e.flags&flagInbound != 0
	}
	if ss := s.sess[fp]; ss != nil && ss.users > 0 {
		out, in = out || !ss.inbound, in || ss.inbound
	}
	return out, in
}

// direction returns an error wrapping ErrDirection if fp was used in the
// other direction than inbound says.
func (s *Store) direction(fp crypto.Fingerprint, inbound bool) error {
	out, in := s.usedLocked(fp)
	if inbound && out || !inbound && in {
		was, now := "outbound", "inbound"
		if in {
			was, now = now, was
		}
		return fmt.Errorf("seqstore: key %x was used %s (%s), so it cannot be used %s: a key serves one direction, for ever: %w", fp[:8], was, s.path, now, ErrDirection)
	}
	return nil
}

// Used reports whether fp was ever used outbound and inbound, as far as
// the store knows: retired negotiated keys are forgotten after Retain.
func (s *Store) Used(fp crypto.Fingerprint) (out, in bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return false, false, err
	}
	out, in = s.usedLocked(fp)
	return out, in, nil
}

// Inbound records, durably before it returns, that an inbound state
// uses fp, and counts one more until its RetireInbound. negotiated is as
// for Resume: the record is negotiated while every state of the key was.
// It returns an error wrapping ErrDirection if fp was ever used outbound.
func (s *Store) Inbound(fp crypto.Fingerprint, negotiated bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	if err := s.direction(fp, true); err != nil {
		return err
	}
	ss := s.sess[fp]
	if ss == nil {
		ss = &session{negotiated: true, inbound: true}
	}
	flags := uint8(flagInbound)
	if ss.negotiated && negotiated {
		flags |= flagNegotiated
	}
	e, ok := s.entries[fp]
	if ok {
		flags &= e.flags | flagInbound // never back to negotiated
	}
	if !ok || e.retired || e.flags != flags {
		if err := s.appendLocked(record{kind: kindReserve, flags: flags, fp: fp}); err != nil {
			return err
		}
	}
	s.sess[fp] = ss
	ss.users++
	ss.negotiated = ss.negotiated && negotiated
	return nil
}

// RetireInbound records that an inbound state of fp (one Inbound) is
// gone; with the last of them, the key's record is retired, and its
// retention starts.
func (s *Store) RetireInbound(fp crypto.Fingerprint) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	ss := s.sess[fp]
	if ss == nil || !ss.inbound {
		return nil
	}
	if ss.users--; ss.users > 0 {
		return nil
	}
	delete(s.sess, fp)
	e, ok := s.entries[fp]
	if !ok || e.retired {
		return nil
	}
	return s.appendLocked(record{kind: kindRetire, flags: e.flags, fp: fp})
}
