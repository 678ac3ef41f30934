package sa

import (
	"sync"

	"github.com/espd/espd/crypto"
)

// SeqStore records, durably, how far each outbound key's sequence numbers
// may have gone, and which keys served inbound states.
//
// The DB never sends a sequence number that a SeqStore has not recorded
// first: AddSA continues above Resume, reserves a block ahead with Reserve
// before handing any of it out, extends the reservation as the state uses
// it, and retires the key with the exact last number sent when the state
// goes. After a crash the store still holds the last reservation, so the
// next AddSA with the same key continues above everything that may have
// been sent. Keys are known only by their fingerprint (crypto.KeyFingerprint).
// A key serves one direction, for ever (the other end numbers its
// packets under it too): the DB records inbound keys with Inbound before
// it installs their state, and refuses a key that Used says served the
// other direction. Methods may be called concurrently.
type SeqStore interface {
	// Resume returns the highest sequence number that may have been sent with key fp (0: never used).
	// negotiated is the state's Config.Negotiated: a durable store may forget a retired key
	// only while every state of it was negotiated, and must keep a manual key's record for ever.
	Resume(fp crypto.Fingerprint, negotiated bool) (uint64, error)
	// Reserve records, durably before it returns, that sequence numbers up to limit may be sent with fp.
	Reserve(fp crypto.Fingerprint, limit uint64) error
	// Retire records that the state keyed with fp is gone after sending exactly up to last.
	Retire(fp crypto.Fingerprint, last uint64) error
	// Inbound records, durably before it returns, that an inbound state uses fp (negotiated as
	// for Resume), and counts it until its RetireInbound. It fails if fp was used outbound.
	Inbound(fp crypto.Fingerprint, negotiated bool) error
	// RetireInbound records that an inbound state of fp (one Inbound) is gone.
	RetireInbound(fp crypto.Fingerprint) error
	// Used reports whether fp was used outbound (Resume) and inbound (Inbound), as far as the
	// store remembers (see Resume's negotiated).
	Used(fp crypto.Fingerprint) (out, in bool, err error)
}

// MemSeqStore is a SeqStore kept in memory: it makes the rules hold for
// the life of the process (a key re-added after delete, or whose state is
// replaced, continues above its old counter) but forgets everything at
// exit. The DB uses one when Options.Seq is nil.
type MemSeqStore struct {
	mu   sync.Mutex
	high map[crypto.Fingerprint]uint64
	dir  map[crypto.Fingerprint]Direction // every key used, by direction
}

// NewMemSeqStore returns an empty in-memory store.
func NewMemSeqStore() *MemSeqStore {
	return &MemSeqStore{high: make(map[crypto.Fingerprint]uint64), dir: make(map[crypto.Fingerprint]Direction)}
}

// use records that fp serves d, unless it served the other direction.
func (m *MemSeqStore) use(fp crypto.Fingerprint, d Direction) error {
	if u, ok := m.dir[fp]; ok && u != d {
		return kindErrorf(ErrKeyReuse, "sa: key %s served dir %v: it cannot serve dir %v: %w", fpString(fp), u, d, ErrKeyDirection)
	}
	m.dir[fp] = d
	return nil
}

// Resume returns the highest sequence number reserved or retired for fp.
// It keeps every key for the life of the process, whatever its origin.
func (m *MemSeqStore) Resume(fp crypto.Fingerprint, _ bool) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.use(fp, DirOut); err != nil {
		return 0, err
	}
	return m.high[fp], nil
}

// Inbound records that fp serves inbound states.
func (m *MemSeqStore) Inbound(fp crypto.Fingerprint, _ bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.use(fp, DirIn)
}

// RetireInbound does nothing: the key stays recorded.
func (m *MemSeqStore) RetireInbound(crypto.Fingerprint) error { return nil }

// Used reports the direction fp served, if any.
func (m *MemSeqStore) Used(fp crypto.Fingerprint) (out, in bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.dir[fp]
	return ok && d == DirOut, ok && d == DirIn, nil
}

// Reserve raises fp's high-water mark to limit (it never lowers it).
func (m *MemSeqStore) Reserve(fp crypto.Fingerprint, limit uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if limit > m.high[fp] {
		m.high[fp] = limit
	}
	return nil
}

// Retire sets fp's high-water mark to last, giving back the unused part
// of the reservation: the DB retires a key only once no live state uses
// it, after its last Reserve.
func (m *MemSeqStore) Retire(fp crypto.Fingerprint, last uint64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.high[fp] = last
	return nil
}

// DefaultSeqBlock is how many sequence numbers an outbound state reserves
// ahead of use when Options.SeqBlock is 0: at 1 Mpps a reservation lasts
// about a second, and a crash wastes at most 1.5 blocks of a 2^32 space.
const DefaultSeqBlock = 1 << 20
