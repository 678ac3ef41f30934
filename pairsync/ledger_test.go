package pairsync

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
)

// recorder is a Recorder that remembers what it recorded and fails on
// demand.
type recorder struct {
	got  map[crypto.Fingerprint]uint64
	fail error
}

func (r *recorder) Reserve(fp crypto.Fingerprint, limit uint64) error {
	if r.fail != nil {
		return r.fail
	}
	r.got[fp] = limit
	return nil
}

// TestLedgerReservations: a reservation is recorded before it is taken,
// only a higher one changes anything (an old message replayed moves
// nothing back), and a failed record leaves the ledger as it was.
func TestLedgerReservations(t *testing.T) {
	rec := &recorder{got: map[crypto.Fingerprint]uint64{}}
	l := NewLedger(rec)
	reserve := func(limits ...uint64) *Message {
		m := &Message{Type: TypeReserve}
		for i, lim := range limits {
			m.Reservations = append(m.Reservations, Reservation{fp(byte(i)), lim})
		}
		return m
	}
	newer, older := reserve(2000, 500), reserve(1000, 700)
	for _, m := range []*Message{newer, older, newer, older} {
		if err := l.Apply(m); err != nil {
			t.Fatal(err)
		}
	}
	for i, want := range []uint64{2000, 700} {
		if got, ok := l.Reserved(fp(byte(i))); !ok || got != want {
			t.Errorf("key %d: reserved %d, %v; want %d", i, got, ok, want)
		}
		if rec.got[fp(byte(i))] != want {
			t.Errorf("key %d: recorded %d, want %d", i, rec.got[fp(byte(i))], want)
		}
	}
	if _, ok := l.Reserved(fp(9)); ok {
		t.Error("a key never reported is reserved")
	}
	rec.fail = errors.New("disk full")
	if err := l.Apply(reserve(3000)); err == nil {
		t.Error("a reservation that could not be recorded was taken")
	}
	if got, _ := l.Reserved(fp(0)); got != 2000 {
		t.Errorf("after a failed record: %d, want 2000", got)
	}
	if err := l.Apply(&Message{Type: TypeAck}); !errors.Is(err, ErrFormat) {
		t.Errorf("an Ack applied: %v", err)
	}
}

// TestLedgerWindows: the ledger's window for a key refuses exactly what
// any report for it refused (esp.ReplayStateSeen), in whatever order the
// reports come, replays included.
func TestLedgerWindows(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for round := range 300 {
		var reports []Window
		base := uint64(r.IntN(300))
		for range 1 + r.IntN(4) {
			w := Window{FP: fp(1), Top: base + uint64(r.IntN(200))}
			if n := r.IntN(9); n > 0 {
				w.Bitmap = make([]byte, n)
				for i := range w.Bitmap {
					w.Bitmap[i] = byte(r.Uint32())
				}
			}
			reports = append(reports, w)
		}
		l := NewLedger(nil)
		for _, i := range append(r.Perm(len(reports)), 0) {
			if err := l.Apply(&Message{Type: TypeWindows, Windows: []Window{reports[i]}}); err != nil {
				t.Fatal(err)
			}
		}
		got, ok := l.Window(fp(1))
		if !ok {
			t.Fatal("no window")
		}
		var top uint64
		for _, w := range reports {
			top = max(top, w.Top)
		}
		if got.Top != top {
			t.Fatalf("round %d: top %d, want %d", round, got.Top, top)
		}
		for seq := uint64(1); seq <= top+2; seq++ {
			want := false
			for _, w := range reports {
				want = want || esp.ReplayStateSeen(w.Top, w.Bitmap, seq)
			}
			if g := esp.ReplayStateSeen(got.Top, got.Bitmap, seq); g != want {
				t.Fatalf("round %d: seq %d seen %v, want %v (reports %+v, union %+v)", round, seq, g, want, reports, got)
			}
		}
	}
}
