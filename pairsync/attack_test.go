package pairsync

import (
	"slices"
	"testing"
	"time"
)

// TestReflected: each node's own messages sent back to it are not
// authentic under the other node's key: dropped and counted as
// reflected, and nothing moves. The active's own Reserve does not take
// the split-brain path (which would burn sequence space), and the
// standby's own Hello and Own make nothing fresh.
func TestReflected(t *testing.T) {
	p := newFakePair(t)
	if _, err := p.b.Resume(fp(8), true); err != nil { // a standby's own key, for its Own
		t.Fatal(err)
	}
	reserveBounded(t, p.b, fp(8), 2<<20)
	p.a.SetRole(RoleActive)
	reserveBounded(t, p.a, fp(1), 1<<20)
	waitFor(t, "a fresh report", func() bool { _, ok := p.b.Report(fp(1)); return ok })
	waitFor(t, "the standby's hello and own", func() bool {
		s := p.b.Stats()
		return s.Sent[TypeHello] > 0 && s.Sent[TypeOwn] > 0
	})
	p.link.quiesce(t)
	astats, bstats := p.a.Stats(), p.b.Stats()
	own := [3][][]byte{1: p.link.take(1, false), 2: p.link.take(2, false)}
	for _, b := range own[1] {
		p.a.receive(b)
	}
	for _, b := range own[2] {
		p.b.receive(b)
	}
	as, bs := p.a.Stats(), p.b.Stats()
	if as.Reflected-astats.Reflected != uint64(len(own[1])) || bs.Reflected-bstats.Reflected != uint64(len(own[2])) {
		t.Fatalf("reflected: node 1 counted %d of %d, node 2 %d of %d", as.Reflected-astats.Reflected, len(own[1]),
			bs.Reflected-bstats.Reflected, len(own[2]))
	}
	if as.SplitBrain != astats.SplitBrain || as.Received != astats.Received || bs.Received != bstats.Received {
		t.Fatalf("a reflected message was taken: split brain %d to %d", astats.SplitBrain, as.SplitBrain)
	}
	if v, _ := p.astore.Resume(fp(1), true); v != 1<<20 {
		t.Fatalf("the active's store holds %d after its own messages came back: sequence space burnt", v)
	}
	if _, ok := p.a.Ledger().Reserved(fp(1)); ok {
		t.Fatal("the active recorded its own reservation as the other node's")
	}
	if _, ok := p.b.Report(fp(8)); ok {
		t.Fatal("the standby's own Own, sent back, made its key fresh")
	}
}

// TestReplayedReordered: an authentic message delivered again, or after
// a later one (reordered, delayed), is dropped and counted; nothing of
// what it says is taken.
func TestReplayedReordered(t *testing.T) {
	p := newFakePair(t)
	p.a.SetRole(RoleActive)
	for i := range 4 {
		reserveBounded(t, p.a, fp(1), uint64(2*i+1)<<20)
	}
	waitFor(t, "a fresh report", func() bool { v, ok := p.b.Report(fp(1)); return ok && v == 7<<20 })
	old := p.link.take(1, false)
	before := p.b.Stats()
	for _, b := range old {
		p.b.receive(b)
	}
	st := p.b.Stats()
	if st.Replayed-before.Replayed != uint64(len(old)) || st.Received != before.Received {
		t.Fatalf("%d messages replayed: %d counted, received %v to %v", len(old), st.Replayed-before.Replayed, before.Received, st.Received)
	}
	if v, _ := p.b.Ledger().Reserved(fp(1)); v != 7<<20 {
		t.Fatalf("the ledger holds %d after the replay", v)
	}

	// Held, then delivered last first: only the newest is taken.
	p.link.set(1, false, TypeReserve, TypeWindows)
	for i := range 3 {
		reserveBounded(t, p.a, fp(2), uint64(2*i+1)<<20)
	}
	held := p.link.take(1, true)
	if len(held) < 3 {
		t.Fatalf("%d messages held", len(held))
	}
	p.link.set(1, false)
	before = p.b.Stats()
	for _, b := range slices.Backward(held) {
		p.b.receive(b)
	}
	st = p.b.Stats()
	if st.Replayed-before.Replayed != uint64(len(held)-1) {
		t.Fatalf("%d messages delivered newest first: %d dropped, want %d", len(held), st.Replayed-before.Replayed, len(held)-1)
	}
	if v, _ := p.b.Ledger().Reserved(fp(2)); v != 5<<20 {
		t.Fatalf("the ledger holds %d, want the newest message's %d", v, 5<<20)
	}
}

// TestReplayedHellos: the standby's hellos, replayed to the active once
// the standby is gone, do not make the active think it alive (its wait
// for a lease stays bounded by the lease after the standby's last real
// message); those of an earlier run of the standby neither.
func TestReplayedHellos(t *testing.T) {
	p := newFakePair(t)
	p.a.SetRole(RoleActive)
	waitFor(t, "hellos", func() bool { return p.a.Stats().Received[TypeHello] > 3 })
	p.link.set(2, true, TypeHello, TypeAck, TypeOwn) // the standby is gone
	hellos := p.link.take(2, false)
	ago, _ := p.a.PeerHeard()
	before := p.a.Stats()
	for _, b := range hellos {
		p.a.receive(b)
	}
	if st := p.a.Stats(); st.Replayed-before.Replayed != uint64(len(hellos)) {
		t.Fatalf("%d hellos replayed: %d dropped", len(hellos), st.Replayed-before.Replayed)
	}
	if now, _ := p.a.PeerHeard(); now < ago {
		t.Fatalf("replayed hellos moved the last heard from %v ago to %v ago", ago, now)
	}
	start := time.Now()
	reserveBounded(t, p.a, fp(3), 1<<20)
	if p.a.Stats().LeaseWaits == 0 {
		t.Fatalf("Reserve returned after %v without a lease wait or an ack", time.Since(start))
	}
}

// TestLeaseDropsByType: whatever types of message the link drops, in
// either direction, at the moment an active's Reserve returns the
// standby holds no fresh report below it. The standby has keys of its
// own, so that its Own messages flow (an Own once moved the echoed
// stamp without the lease's deadline).
func TestLeaseDropsByType(t *testing.T) {
	cases := []struct {
		name     string
		from     int
		dropped  []Type
		fromBoth []Type
	}{
		{"hellos", 2, []Type{TypeHello}, nil},
		{"acks", 2, []Type{TypeAck}, nil},
		{"hellos and acks, own through", 2, []Type{TypeHello, TypeAck}, nil},
		{"own", 2, []Type{TypeOwn}, nil},
		{"reserves", 1, []Type{TypeReserve}, nil},
		{"windows", 1, []Type{TypeWindows}, nil},
		{"reserves and acks", 1, []Type{TypeReserve}, []Type{TypeAck}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newFakePair(t, func(a, _ *Config) {
				a.Windows = func() []Window { return []Window{{FP: fp(9), Top: 1}} }
			})
			if _, err := p.b.Resume(fp(8), true); err != nil {
				t.Fatal(err)
			}
			reserveBounded(t, p.b, fp(8), 2<<20)
			p.a.SetRole(RoleActive)
			reserveBounded(t, p.a, fp(1), 1<<20)
			waitFor(t, "a fresh report", func() bool { _, ok := p.b.Report(fp(1)); return ok })
			p.link.set(c.from, true, c.dropped...)
			if c.fromBoth != nil {
				p.link.set(3-c.from, true, c.fromBoth...)
			}
			for k := uint64(2); k <= 5; k++ {
				lim := (2*k - 1) << 20
				reserveBounded(t, p.a, fp(1), lim)
				checkLease(t, p.b, fp(1), lim, c.name)
			}
		})
	}
}

// TestEarlierRun: a message of an earlier run of the other node (a lower
// epoch) is dropped while its current run is heard, whatever its
// counter; a later run is taken at once (a restart); a lower one only
// once the current run has been silent for two leases (a clock set back
// across a restart).
func TestEarlierRun(t *testing.T) {
	p := newFakePair(t)
	waitFor(t, "a hello", func() bool { return p.a.Stats().Received[TypeHello] > 0 })
	k21 := testKey.Direction(2)
	hello := func(epoch uint64) []byte {
		b, err := (&Message{Type: TypeHello, Node: 2, Params: p.b.digest, Epoch: epoch, Counter: 1 << 40}).Append(nil, &k21)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cur := p.b.Epoch()
	before := p.a.Stats()
	p.a.receive(hello(cur - 1))
	if st := p.a.Stats(); st.Replayed != before.Replayed+1 || st.Received != before.Received {
		t.Fatalf("a message of an earlier run taken: %+v", st)
	}
	p.link.set(2, true, TypeHello, TypeAck, TypeOwn) // the current run falls silent
	p.a.receive(hello(cur + 1))                      // a later run: taken at once
	silent := time.Now()
	if st := p.a.Stats(); st.Received[TypeHello] != before.Received[TypeHello]+1 {
		t.Fatal("a later run of the other node refused")
	}
	p.a.receive(hello(cur)) // lower than the run just taken
	if st := p.a.Stats(); st.Replayed != before.Replayed+2 {
		t.Fatal("a lower run taken while the current one is heard")
	}
	waitFor(t, "a lower run taken after two silent leases", func() bool {
		n := p.a.Stats().Received[TypeHello]
		p.a.receive(hello(cur))
		return p.a.Stats().Received[TypeHello] > n
	})
	if d := time.Since(silent); d < 2*testLease-10*time.Millisecond {
		t.Fatalf("a lower run taken after %v of silence, before two leases (%v)", d, 2*testLease)
	}
}
