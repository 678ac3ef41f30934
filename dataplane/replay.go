package dataplane

import (
	"encoding/binary"
	"sync"

	"github.com/espd/espd/esp"
	"github.com/espd/espd/sa"
)

// Parallel workers finish batches out of order. If each worker advanced
// the replay window as it decrypted (esp.Decapsulator.Decapsulate does),
// a worker that is overtaken by others holding later batches of the same
// state would find its packets behind the window and drop them whenever
// the workers are more than a window apart (8 workers with batches of 128
// are, for any usual window). The kernel has the same problem with pcrypt
// and solves it the same way: the window is checked before decryption and
// advanced after it, in arrival order.
//
// So the workers check the state's real window (esp.ReplayWindow.Check,
// lock-free, before spending crypto on a replay), then decapsulate with a
// shadow Decapsulator: the state's transform with a window of size 0 that
// checks nothing and only tracks the highest sequence number for ESN
// inference. The in-order writer then records each authentic packet in the
// real window (esp.ReplayWindow.Update), which refuses duplicates that
// were in flight together.

// shadow is the workers' Decapsulator for one state's Decapsulator.
type shadow struct {
	s    *sa.SA
	real *esp.Decapsulator
	dec  esp.Decapsulator
}

// shadows maps *esp.Decapsulator to *shadow.
type shadows struct{ m sync.Map }

// get returns the shadow of real (whose Replay is not nil).
func (sh *shadows) get(s *sa.SA, real *esp.Decapsulator) *shadow {
	if v, ok := sh.m.Load(real); ok {
		return v.(*shadow)
	}
	w := esp.NewReplayWindow(0, real.Replay.ESN())
	// Start inference where the state is (it may be an UpdateSA'd
	// Decapsulator sharing an old window).
	if top := real.Replay.Top(); top != 0 {
		w.Update(top)
	}
	n := &shadow{s: s, real: real, dec: esp.Decapsulator{Transform: real.Transform, Replay: w, ECN: real.ECN}}
	v, _ := sh.m.LoadOrStore(real, n)
	return v.(*shadow)
}

// prune forgets the shadows of states that died or got a new
// Decapsulator.
func (sh *shadows) prune() {
	sh.m.Range(func(k, v any) bool {
		s := v.(*shadow)
		if !s.s.Alive() || s.s.Decapsulator() != s.real {
			sh.m.Delete(k)
		}
		return true
	})
}

// open is the workers' decapsulation of e.
func open(e *elem) ([]byte, error) {
	pkt := e.buf[e.start:e.end]
	if e.win == nil {
		inner, _, err := e.dec.Decapsulate(pkt, e.tos)
		return inner, err
	}
	if len(pkt) < esp.HeaderLen {
		return nil, esp.ErrMalformed
	}
	if err := e.win.Check(e.win.Infer(binary.BigEndian.Uint32(pkt[4:8]))); err != nil {
		return nil, err
	}
	inner, seq, err := e.dec.Decapsulate(pkt, e.tos)
	switch err {
	case nil, esp.ErrDummy, esp.ErrECNDrop:
		// Authentic: the writer records it in the window.
		e.seq, e.authentic = seq, true
	}
	return inner, err
}
