package dataplane

import (
	"testing"
	"time"
)

// TestOffloaderDecisions walks an handOffGauge through its states: inline
// without a sample, to the workers once the crypto is measured slower than
// the threshold, back to inline only once it is 25% faster and nothing is
// in flight; small batches are no sample; a threshold of 0 always hands
// off.
func TestOffloaderDecisions(t *testing.T) {
	var o handOffGauge
	o.below.Store(1000) // MB/s
	q := newQueues(4)
	if o.handsOff(q) {
		t.Fatal("no sample yet: want inline")
	}
	o.record(1000, time.Millisecond) // too small to be a sample
	if o.handsOff(q) || o.rate.Load() != 0 {
		t.Fatalf("a 1000-byte batch was taken as a sample (rate %d)", o.rate.Load())
	}
	o.record(64<<10, 131*time.Microsecond) // 500 MB/s
	if got := o.rate.Load(); got != 500 {
		t.Fatalf("rate %d MB/s, want 500", got)
	}
	if !o.handsOff(q) {
		t.Fatal("500 MB/s against 1000: want the workers")
	}
	for range 8 {
		o.record(64<<10, 55*time.Microsecond) // 1191 MB/s: not 25% above
	}
	if got := o.rate.Load(); got >= 1250 || got < 1000 {
		t.Fatalf("rate %d MB/s after eight samples of 1191, want within [1000, 1250)", got)
	}
	if !o.handsOff(q) {
		t.Fatal("within the hysteresis band: want the workers still")
	}
	for range 20 {
		o.record(64<<10, 32*time.Microsecond) // 2048 MB/s
	}
	q.pushed.Store(3)
	q.done.Store(2)
	if !o.handsOff(q) {
		t.Fatal("a batch in flight: going inline now would overtake it")
	}
	q.done.Store(3)
	if o.handsOff(q) {
		t.Fatalf("rate %d MB/s and nothing in flight: want inline", o.rate.Load())
	}
	if o.handing.Load() {
		t.Fatal("handOff still set after going inline")
	}
	o.below.Store(0)
	if !o.handsOff(q) {
		t.Fatal("HandOffBelow 0: want the workers always")
	}
}

// TestPushCountsInFlight checks that a push counts the batch as in flight
// until the in-order stage finishes it, and that a failed push does not.
func TestPushCountsInFlight(t *testing.T) {
	q := newQueues(1)
	p := newProducer()
	b1, b2 := &batch{}, &batch{}
	if !q.push(b1, p) {
		t.Fatal("push into an empty queue failed")
	}
	if got := q.inFlight(); got != 1 {
		t.Fatalf("in flight %d, want 1", got)
	}
	if q.push(b2, p) { // the in-order stage finishes nothing: the push stalls and gives up
		t.Fatal("push into a full, stuck queue succeeded")
	}
	if got := q.inFlight(); got != 1 {
		t.Fatalf("in flight %d after a failed push, want 1", got)
	}
	<-q.inorder
	<-q.crypto
	q.done.Add(1)
	if got := q.inFlight(); got != 0 {
		t.Fatalf("in flight %d after the stage finished, want 0", got)
	}
}
