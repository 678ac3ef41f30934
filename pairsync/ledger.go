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

// PeerRecorder is a Recorder that knows the records it takes are the
// other node's: ReservePeer records as Reserve does, and ForgetPeer
// retires the record of a key the other node no longer reports, unless
// this node uses it, so that it expires as a negotiated key's does
// (seqstore.Store). The Ledger uses these when its Recorder has them.
type PeerRecorder interface {
	ReservePeer(fp crypto.Fingerprint, limit uint64) error
	ForgetPeer(fp crypto.Fingerprint) error
}

// RecordError is Apply's error: the keys whose reservation the Recorder
// refused (the others were recorded), and its first error.
type RecordError struct {
	FPs []crypto.Fingerprint
	Err error
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("pairsync: recording the other node's reservations: %d refused, the first: %v", len(e.FPs), e.Err)
}

func (e *RecordError) Unwrap() error { return e.Err }

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

// Apply takes a Reserve, Own or Windows message. Its reservations are
// recorded (Recorder first) before Apply returns, which is when an Ack
// of them may go. One the Recorder refuses is skipped, the others still
// taken, and the error is a *RecordError naming what was refused.
func (l *Ledger) Apply(m *Message) error {
	switch m.Type {
	case TypeReserve, TypeOwn:
		var re *RecordError
		for _, r := range m.Reservations {
			if err := l.reserve(r); err != nil {
				if re == nil {
					re = &RecordError{Err: err}
				}
				re.FPs = append(re.FPs, r.FP)
			}
		}
		if re != nil {
			return re
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
	if pr, ok := l.rec.(PeerRecorder); ok {
		if err := pr.ReservePeer(r.FP, r.Limit); err != nil {
			return err
		}
	} else if l.rec != nil {
		if err := l.rec.Reserve(r.FP, r.Limit); err != nil {
			return err
		}
	}
	l.reserved[r.FP] = r.Limit
	return nil
}

// Forget drops what the ledger holds of fp and, with a PeerRecorder,
// retires its record (forget.go).
func (l *Ledger) Forget(fp crypto.Fingerprint) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, had := l.reserved[fp]
	delete(l.reserved, fp)
	delete(l.windows, fp)
	if pr, ok := l.rec.(PeerRecorder); ok && had {
		return pr.ForgetPeer(fp)
	}
	return nil
}

// Len returns how many keys' reservations and windows the ledger holds.
func (l *Ledger) Len() (reserved, windows int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.reserved), len(l.windows)
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
