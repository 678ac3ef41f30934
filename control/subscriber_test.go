package control

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/packet"
	"github.com/espd/espd/sa"
)

// subscribeRaw subscribes a raw connection and returns once the reply came.
func subscribeRaw(t *testing.T, path string) *rawConn {
	t.Helper()
	rc := rawDial(t, path)
	rc.nc.(interface{ SetReadBuffer(int) error }).SetReadBuffer(1024)
	rc.send(encode(t, wire.MsgSubscribe, 0, 1, nil))
	m, err := rc.read()
	if err != nil || m.Type != wire.MsgSubscribe || m.Flags&wire.FlagReply == 0 {
		t.Fatalf("subscribe reply: %v %v", m, err)
	}
	return rc
}

func acquirePolicy(t *testing.T, ts *testServer) sa.Policy {
	t.Helper()
	p, err := ts.db.AddPolicy(sa.Policy{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.0.0/16")},
		Dir: sa.DirOut, ReqID: 1, TmplSrc: v4a, TmplDst: v4b})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func flowN(i int) packet.Flow {
	return packet.Flow{Src: v4a, Dst: netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)}), Proto: 6, SrcPort: uint16(i), DstPort: 80}
}

// TestStuckSubscriber: a subscriber that never reads does not block the
// event producer, other clients or other subscribers, and is disconnected
// after WriteTimeout.
func TestStuckSubscriber(t *testing.T) {
	ts := startServer(t, ServerConfig{WriteTimeout: 300 * time.Millisecond, EventQueue: 16})
	pol := acquirePolicy(t, ts)
	stuck := subscribeRaw(t, ts.path)

	live := dial(t, ts.path)
	ctx := testCtx(t)
	liveEvents, err := live.Subscribe(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var liveGot atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range liveEvents {
			liveGot.Add(1)
		}
	}()

	// The producer: many events, which must all be published (delivered
	// or dropped) without waiting for anyone.
	const n = 20000
	produced := make(chan struct{})
	go func() {
		defer close(produced)
		for i := range n {
			ts.db.Acquire(pol, flowN(i))
		}
	}()
	other := dial(t, ts.path)
	for range 20 {
		if _, err := other.Stats(ctx); err != nil {
			t.Fatalf("other client during the flood: %v", err)
		}
	}
	select {
	case <-produced:
	case <-time.After(20 * time.Second):
		t.Fatal("event producer blocked by a subscriber")
	}
	if _, err := other.ListSAs(ctx); err != nil {
		t.Fatal(err)
	}
	// The stuck subscriber is disconnected: only live and other remain.
	// Its writes block only once its socket buffer is full, and how many
	// of the flood's events reached it depends on scheduling (the rest
	// were dropped from its queue), so keep events coming until then.
	deadline := time.Now().Add(15 * time.Second)
	for i := n; ts.Stats().Active != 2; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("stuck subscriber not disconnected: %+v", ts.Stats())
		}
		ts.db.Acquire(pol, flowN(i))
		if i%64 == 0 {
			time.Sleep(5 * time.Millisecond)
		}
	}
	// What it had buffered is readable, then the connection ends.
	for {
		m, err := stuck.read()
		if err != nil {
			break
		}
		if m.Type != wire.MsgEvent {
			t.Fatalf("stuck subscriber got %v", m.Type)
		}
	}
	if g, _ := other.Stats(ctx); g.Global.EventsDropped == 0 {
		t.Fatal("no events counted as dropped")
	}
	// The live subscriber kept receiving.
	deadline = time.Now().Add(15 * time.Second)
	for liveGot.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("live subscriber got no events")
		}
		time.Sleep(10 * time.Millisecond)
	}
	live.Close()
	wg.Wait()
}

// TestEventsLost: a subscriber that falls behind is told, in the next
// event it gets, how many were dropped; every event is either delivered or
// counted.
func TestEventsLost(t *testing.T) {
	ts := startServer(t, ServerConfig{WriteTimeout: 20 * time.Second, EventQueue: 8})
	pol := acquirePolicy(t, ts)
	rc := subscribeRaw(t, ts.path)

	const flood = 3000
	for i := range flood {
		ts.db.Acquire(pol, flowN(i))
	}
	var mu sync.Mutex
	var got, lost uint64
	lastReqID := uint32(0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() {
		for {
			m, err := rc.read()
			if err != nil {
				return
			}
			e, err := wire.ReadEvent(m.Attrs)
			if err != nil {
				t.Errorf("event: %v", err)
				return
			}
			mu.Lock()
			got++
			lost += e.Lost
			lastReqID = e.Policy.ReqID
			mu.Unlock()
		}
	}()
	// Markers, each with its own reqid, one at a time until one arrives.
	published := uint64(flood)
	var marker uint32
	for marker = 1000; ; marker++ {
		if ctx.Err() != nil {
			t.Fatal("no marker event arrived")
		}
		p := pol
		p.ReqID = marker
		ts.db.Acquire(p, flowN(int(marker)))
		published++
		time.Sleep(50 * time.Millisecond)
		mu.Lock()
		arrived := lastReqID == marker
		mu.Unlock()
		if arrived {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if lost == 0 {
		t.Fatal("no event reported lost")
	}
	if got+lost != published {
		t.Fatalf("delivered %d + lost %d = %d, published %d", got, lost, got+lost, published)
	}
	t.Logf("published %d: delivered %d, reported lost %d", published, got, lost)
}
