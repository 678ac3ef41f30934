package seqstore

import "github.com/espd/espd/crypto"

// Refuse is the store espd uses when its state directory cannot be read:
// it refuses every outbound key with Err, because it cannot know which
// sequence numbers were already sent with it. Inbound states keep
// working, unrecorded.
type Refuse struct{ Err error }

// Resume returns r.Err.
func (r Refuse) Resume(crypto.Fingerprint, bool) (uint64, error) { return 0, r.Err }

// Reserve returns r.Err.
func (r Refuse) Reserve(crypto.Fingerprint, uint64) error { return r.Err }

// Retire returns r.Err.
func (r Refuse) Retire(crypto.Fingerprint, uint64) error { return r.Err }

// Inbound returns nil: inbound states keep working. Their keys are not
// recorded, so a key used inbound now is not refused outbound later; the
// recovery from a refused store (docs/safety.md) installs fresh keys.
func (Refuse) Inbound(crypto.Fingerprint, bool) error { return nil }

// RetireInbound returns nil.
func (Refuse) RetireInbound(crypto.Fingerprint) error { return nil }

// Used knows nothing: it returns false, false, nil (Resume refuses every
// outbound key anyway).
func (Refuse) Used(crypto.Fingerprint) (out, in bool, err error) { return false, false, nil }
