package dataplane

import (
	"testing"
	"time"
)

// TestHandOffGaugeDecisions walks a handOffGauge through its states: run
// to completion without a sample, hand-off to the workers once the crypto
// is measured slower than the threshold, back to run to completion only
// once it is 25% faster and nothing is in flight; small batches are no
// sample; a threshold of 0 always hands off.
func TestHandOffGaugeDecisions(t *testing.T) {
	var g handOffGauge
	g.below.Store(1000) // MB/s
	q := newQueues(1, 4, nil)
	if g.handsOff(q) {
		t.Fatal("no sample yet: want run to completion")
	}
	g.record(1000, time.Millisecond) // too small to be a sample
	if g.handsOff(q) || g.rate.Load() != 0 {
		t.Fatalf("a 1000-byte batch was taken as a sample (rate %d)", g.rate.Load())
	}
	g.record(64<<10, 131*time.Microsecond) // 500 MB/s
	if got := g.rate.Load(); got != 500 {
		t.Fatalf("rate %d MB/s, want 500", got)
	}
	if !g.handsOff(q) {
		t.Fatal("500 MB/s against 1000: want the workers")
	}
	for range 8 {
		g.record(64<<10, 55*time.Microsecond) // 1191 MB/s: not 25% above
	}
	if got := g.rate.Load(); got >= 1250 || got < 1000 {
		t.Fatalf("rate %d MB/s after eight samples of 1191, want within [1000, 1250)", got)
	}
	if !g.handsOff(q) {
		t.Fatal("within the hysteresis band: want the workers still")
	}
	for range 20 {
		g.record(64<<10, 32*time.Microsecond) // 2048 MB/s
	}
	q.pushed.Store(3)
	q.done.Store(2)
	if !g.handsOff(q) {
		t.Fatal("a batch in flight: running to completion now would overtake it")
	}
	q.done.Store(3)
	if g.handsOff(q) {
		t.Fatalf("rate %d MB/s and nothing in flight: want run to completion", g.rate.Load())
	}
	if g.handing.Load() {
		t.Fatal("handing still set after returning to run to completion")
	}
	g.below.Store(0)
	if !g.handsOff(q) {
		t.Fatal("HandOffBelow 0: want the workers always")
	}
}

// TestPushCountsInFlight checks that a push counts the batch as in flight
// in each shard until that shard's stage finishes it, that a failed push
// does not, and that the batch returns to the pool with the last of its
// references (its shards' and the worker's).
func TestPushCountsInFlight(t *testing.T) {
	bp := newPool(4)
	q := newQueues(2, 1, bp)
	p := newProducer(2)
	b1, b2 := bp.get(), bp.get()
	b1.crypto.Add(1)
	p.add(0)
	p.add(1)
	if dropped := q.push(b1, p); dropped != 0 {
		t.Fatalf("push into empty queues dropped %d packets", dropped)
	}
	if got := q.inFlight(); got != 2 {
		t.Fatalf("in flight %d, want 2 (one per shard)", got)
	}
	if p.mask != 0 || p.live[0] != 0 || p.live[1] != 0 {
		t.Fatalf("producer not reset: mask %b, live %v", p.mask, p.live)
	}
	// Shard 1 is full and stuck: the push gives up on it and counts its
	// packets, but shard 0 takes the batch.
	<-q.shards[0].inorder
	b2.crypto.Add(1)
	p.add(0)
	p.add(1)
	p.add(1)
	if dropped := q.push(b2, p); dropped != 2 {
		t.Fatalf("push with shard 1 stuck dropped %d packets, want 2", dropped)
	}
	if got := q.inFlight(); got != 3 {
		t.Fatalf("in flight %d after a push that shard 1 refused, want 3", got)
	}
	if got := b2.refs.Load(); got != 2 {
		t.Fatalf("b2 holds %d references, want 2 (shard 0 and the worker)", got)
	}
	// The worker finishes both; then the stages.
	for _, b := range []*batch{<-q.crypto, <-q.crypto} {
		b.crypto.Done()
		q.unref(b)
	}
	q.finished(b1, 0)
	if got := b1.refs.Load(); got != 1 {
		t.Fatalf("b1 holds %d references after the worker and shard 0, want 1", got)
	}
	<-q.shards[1].inorder
	q.finished(b1, 1)
	<-q.shards[0].inorder
	q.finished(b2, 0)
	if got := q.inFlight(); got != 0 {
		t.Fatalf("in flight %d after the stages finished, want 0", got)
	}
	if b1.refs.Load() != 0 || b2.refs.Load() != 0 {
		t.Fatalf("references left: %d, %d", b1.refs.Load(), b2.refs.Load())
	}
	// Nothing takes a batch: the push returns it unlocked.
	b3 := bp.get()
	b3.crypto.Add(1)
	q.shards[0].inorder <- b1
	p.stalled[0], p.at[0] = true, q.shards[0].done.Load()
	p.add(0)
	if dropped := q.push(b3, p); dropped != 1 {
		t.Fatalf("push into a stalled shard dropped %d packets, want 1", dropped)
	}
	waited := make(chan struct{})
	go func() { b3.crypto.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("a batch no shard took still waits for its crypto")
	}
}
