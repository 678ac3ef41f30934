package pairsync

import (
	"fmt"
	"sync"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
)

// Recorder records a reservation durably before the Ledger takes it, as
// sa.SeqStore's Reserve does: the standby's own sequence-number store,
// so that a standby that restarts still continues above the active.
type Recorder interface {
	Reserve(fp crypto.Fingerprint, limit uint64) error
}

// Ledger is the standby's record of what the active reported: the highest
// reservation of each outbound key and the union of each inbound key's
// replay windows. It only ever moves up. Methods may be called
// concurrently.
type Ledger struct {
	rec      Recorder
	mu       sync.Mutex
	reserved map[crypto.Fingerprint]uint64
	windows  map[crypto.Fingerprint]Window
}

// NewLedger returns an empty ledger that records reservations with rec
// (nil: in memory only).
func NewLedger(rec Recorder) *Ledger {
	return &Ledger{rec: rec, reserved: map[crypto.Fingerprint]uint64{}, windows: map[crypto.Fingerprint]Window{}}
}

// Apply takes a Reserve, Own or Windows message. A Reserve's reservations are
// recorded (Recorder first) before Apply returns nil, which is when its
// Ack may go; on an error some may have been taken, none is lost.
func (l *Ledger) Apply(m *Message) error {
	switch m.Type {
	case TypeReserve, TypeOwn:
		for _, r := range m.Reservations {
			if err := l.reserve(r); err != nil {
				return err
			}
		}
	case TypeWindows:
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, w := range m.Windows {
			if old, ok := l.windows[w.FP]; ok {
				w = unionWindow(old, w)
			} else {
				w.Bitmap = append([]byte(nil), w.Bitmap...)
			}
			l.windows[w.FP] = w
		}
	default:
		return fmt.Errorf("%w: a ledger takes no %v", ErrFormat, m.Type)
	}
	return nil
}

// reserve records one reservation if it raises the key's.
func (l *Ledger) reserve(r Reservation) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r.Limit <= l.reserved[r.FP] {
		return nil
	}
	if l.rec != nil {
		if err := l.rec.Reserve(r.FP, r.Limit); err != nil {
			return fmt.Errorf("pairsync: recording the peer's reservation: %w", err)
		}
	}
	l.reserved[r.FP] = r.Limit
	return nil
}

// Reserved returns the highest reservation reported for fp, and whether
// one was.
func (l *Ledger) Reserved(fp crypto.Fingerprint) (uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.reserved[fp]
	return v, ok
}

// Window returns the union of the windows reported for fp (a copy), and
// whether one was.
func (l *Ledger) Window(fp crypto.Fingerprint) (Window, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w, ok := l.windows[fp]
	w.Bitmap = append([]byte(nil), w.Bitmap...)
	return w, ok
}

// unionWindow returns the window that refuses what either a or b refuses
// (esp.ReplayStateSeen): the higher top, with the bitmap of that report's
// coverage, a bit set where either report counts the number as seen.
func unionWindow(a, b Window) Window {
	hi, lo := a, b
	if b.Top > a.Top || (b.Top == a.Top && len(b.Bitmap) > len(a.Bitmap)) {
		hi, lo = b, a
	}
	u := Window{FP: hi.FP, Top: hi.Top}
	if len(hi.Bitmap) == 0 {
		return u
	}
	u.Bitmap = make([]byte, len(hi.Bitmap))
	for i := uint64(0); i < uint64(len(hi.Bitmap))*8 && i < hi.Top; i++ {
		seq := hi.Top - i
		if esp.ReplayStateSeen(hi.Top, hi.Bitmap, seq) || esp.ReplayStateSeen(lo.Top, lo.Bitmap, seq) {
			u.Bitmap[i/8] |= 1 << (i % 8)
		}
	}
	return u
}
