package dataplane

import (
	"sync/atomic"
	"time"

	"github.com/espd/espd/crypto"
)

// minRateSample is the least crypto payload of a batch whose timing is
// taken into a direction's crypto rate: below it the fixed cost per batch
// and per packet, not the cipher, sets the time.
const minRateSample = 16 << 10

// handOffGauge decides, for one direction with workers and a
// Config.HandOffBelow rate, whether a reader hands a batch off to the
// workers and the in-order stage or runs its crypto and I/O itself (runs
// it to completion).
//
// Handing off pays where the crypto is slow: it spreads one flow's crypto
// over the cores, as pcrypt does. Where it is fast (AES-GCM with AES-NI,
// ChaCha20-Poly1305 with AVX2) the two goroutine handoffs per batch, the
// thread wakeups and the batch's trip through other cores' caches cost
// more than the crypto they spread (docs/benchmarks-history.md, "Workers or
// run to completion": 35% more CPU per byte with AES-GCM on the 2-core
// harness machine). So both the readers and the workers time the crypto
// of the batches that carry at least minRateSample bytes; while
// the measured rate is below HandOffBelow the batches are handed off, and
// once it is 25% above it the readers run them to completion again, but
// only when no batch of the direction is queued or in the in-order stage,
// so that each state's packets still leave in the order they arrived.
type handOffGauge struct {
	below   atomic.Int64 // MB/s (bytes per microsecond); 0: always hand off (tests change it)
	rate    atomic.Int64 // bytes per microsecond, moving average; 0: no sample yet
	handing atomic.Bool  // batches are being handed off
	changed func()       // called after handing changed (Device.handOffChanged); must not block
}

// handsOff reports whether the next batch goes to the workers. q's
// batches in flight must be none for the answer to be false.
func (o *handOffGauge) handsOff(q *queues) bool {
	below := o.below.Load()
	if below <= 0 {
		return true
	}
	if !o.handing.Load() {
		return q.inFlight() > 0 // a batch handed off earlier is still on its way
	}
	r := o.rate.Load()
	if r*4 < below*5 || q.inFlight() > 0 { // handing is set only after a sample: r > 0
		return true
	}
	if o.handing.CompareAndSwap(true, false) && o.changed != nil {
		o.changed()
	}
	return false
}

// record takes the crypto of bytes that took d into the rate and updates
// the decision. Readers and workers call it concurrently: a lost update
// only drops a sample.
func (o *handOffGauge) record(bytes int, d time.Duration) {
	below := o.below.Load()
	if below <= 0 || bytes < minRateSample {
		return
	}
	us := d.Microseconds()
	if us <= 0 {
		us = 1
	}
	sample := int64(bytes) / us
	r := o.rate.Load()
	if r == 0 {
		r = sample
	} else {
		r += (sample - r) / 4
	}
	o.rate.Store(max(r, 1))
	// The Load spares the CAS (a write of the shared line) on every sample.
	if r < below && !o.handing.Load() && o.handing.CompareAndSwap(false, true) && o.changed != nil {
		o.changed()
	}
}

// timeCrypto runs the batch's crypto step (encrypt or decrypt) on b,
// timing it when the rate decides anything and the batch is large enough
// to be a sample. The step runs under crypto.DoSecret: the stack frames
// and registers in which the ciphers held key material are erased before
// the goroutine goes on (docs/benchmarks-history.md, "Erasing keys:
// runtime/secret around every batch's crypto").
func (o *handOffGauge) timeCrypto(b *batch, step func(*batch)) {
	if o.below.Load() <= 0 {
		runSecret(step, b)
		return
	}
	n := cryptoBytes(b)
	if n < minRateSample {
		runSecret(step, b)
		return
	}
	t := time.Now()
	runSecret(step, b)
	o.record(n, time.Since(t))
}

// runSecret runs step(b) under crypto.DoSecret.
func runSecret(step func(*batch), b *batch) {
	crypto.DoSecret(func() { step(b) })
}

// inFlight is the number of batches pushed and not yet finished by the
// in-order stage.
func (q *queues) inFlight() uint64 { return q.pushed.Load() - q.done.Load() }

// cryptoBytes is the payload the batch's crypto covers: the live packets'
// bytes.
func cryptoBytes(b *batch) int {
	n := 0
	for i := range b.n {
		if e := &b.elems[i]; e.drop == pass {
			n += e.end - e.start
		}
	}
	return n
}
