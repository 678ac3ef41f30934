package gwpair

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/metrics"
	"github.com/espd/espd/metrics/metricstest"
	"github.com/espd/espd/pairsync"
	"github.com/espd/espd/sa"
)

// reserveWithin runs n.Reserve, which must return within 10 s.
func reserveWithin(t *testing.T, n *pairsync.Node, fp crypto.Fingerprint, limit uint64) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- n.Reserve(fp, limit) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Reserve(%d): %v", limit, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Reserve(%d) still waits after 10 s", limit)
	}
}

// TestMetricsPair drives a gateway pair's two nodes (loopback UDP, the
// daemon's own wiring) through every event the espd_pair_* series count,
// scraping each node's /metrics (Pair.Metrics as the daemon exports it)
// before and after: every series must have moved on one node at least
// and carry its counter (daemon's TestMetricsPairListed holds them to its
// movedElsewhere). An endpoint without a pair exports none.
func TestMetricsPair(t *testing.T) {
	if body := scrape(t, metrics.New(metrics.Sources{DB: sa.NewDB(sa.Options{}), Dataplane: noDP})); strings.Contains(body, "espd_pair_") {
		t.Errorf("espd_pair_* series without a pair:\n%s", body)
	}

	a, b, start := newPairNodes(t)
	nodes := []*pairNode{a, b}
	scrapeAll := func() []series {
		var out []series
		for _, n := range nodes {
			out = append(out, scrapeBody(t, func(t *testing.T) string { return scrape(t, n.handler()) }))
		}
		return out
	}
	before := scrapeAll()
	for i, s := range before {
		if v, ok := s["espd_pair_peer_heard_seconds{}"]; ok {
			t.Errorf("node %d: espd_pair_peer_heard_seconds = %v before anything was heard", i+1, v)
		}
	}
	start()

	// Node 1 active: its reservations are acknowledged (hellos from node
	// 2 first, so that the lease does not run out meanwhile), its windows
	// reported.
	a.setRole(t, wire.PairRoleActive)
	pairWait(t, "node 1 hears node 2", func() bool { _, ok := a.node.PeerHeard(); return ok })
	in, out, unreported := pairState(t, 0x400, sa.DirIn), pairState(t, 0x500, sa.DirOut), pairState(t, 0x501, sa.DirOut)
	sIn := a.add(t, in)
	b.add(t, in)
	for seq := uint64(1); seq <= 10; seq++ {
		accept(sIn, seq)
	}
	a.add(t, out)
	reported := b.add(t, out)
	b.add(t, unreported)
	b.add(t, pairState(t, 0x401, sa.DirIn)) // never reported: a stale window at the takeover
	for k := range 3 {
		reserveWithin(t, a.node, crypto.Fingerprint{0xee, byte(k)}, 1<<20)
	}
	pairWait(t, "an acknowledged reservation and a window report", func() bool {
		return a.node.Stats().AckWaits > 0 && b.node.Stats().Received[pairsync.TypeWindows] > 0
	})

	// Forgeries to node 2: garbage, and an authentic message of an unknown
	// type, which counts as rejected (no type="other" series).
	evil, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Close()
	hello, err := (&pairsync.Message{Type: pairsync.TypeHello, Epoch: 1, Counter: 1}).Append(nil, &pairTestKey)
	if err != nil {
		t.Fatal(err)
	}
	unknown := append([]byte(nil), hello[:len(hello)-sha256.Size]...)
	unknown[5] = 9 // the type
	mac := hmac.New(sha256.New, pairTestKey[:])
	mac.Write(unknown)
	unknown = mac.Sum(unknown)
	rejected := b.node.Stats().Rejected
	for _, d := range [][]byte{[]byte("not a pair message"), unknown} {
		if _, err := evil.WriteTo(d, b.conn.LocalAddr()); err != nil {
			t.Fatal(err)
		}
	}
	pairWait(t, "the forgeries rejected", func() bool { return b.node.Stats().Rejected >= rejected+2 })
	if st := b.node.Stats(); st.Received[0] != 0 {
		t.Errorf("an authentic message of an unknown type counted as received (%d): export type=\"other\"", st.Received[0])
	}
	// From node 1's address: node 2's own message sent back, an old one
	// of node 1 (replayed), and one of a node 1 that calls itself 2.
	k12, k21 := pairTestKey.Direction(1), pairTestKey.Direction(2)
	for _, m := range []struct {
		m pairsync.Message
		k *pairsync.Key
	}{
		{pairsync.Message{Type: pairsync.TypeHello, Node: 2, Params: b.node.Params(), Epoch: b.node.Epoch(), Counter: 1}, &k21},
		{pairsync.Message{Type: pairsync.TypeHello, Node: 1, Params: a.node.Params(), Epoch: a.node.Epoch(), Counter: 1}, &k12},
		{pairsync.Message{Type: pairsync.TypeHello, Node: 2, Params: a.node.Params(), Epoch: a.node.Epoch() + 1, Counter: 1}, &k12},
	} {
		d, err := m.m.Append(nil, m.k)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.conn.PacketConn.WriteTo(d, b.conn.LocalAddr()); err != nil {
			t.Fatal(err)
		}
	}
	pairWait(t, "a reflected, a replayed and a misconfigured message", func() bool {
		st := b.node.Stats()
		return st.Reflected > 0 && st.Replayed > 0 && st.Misconfigured > 0
	})
	// A key node 1 no longer carries is forgotten on node 2.
	if err := a.node.Retire(crypto.Fingerprint{0xee, 2}, 1); err != nil {
		t.Fatal(err)
	}
	pairWait(t, "a key forgotten", func() bool { return b.node.Stats().Forgotten > 0 })

	// Node 2's store fails: it cannot record a reservation, so it does
	// not acknowledge it, and node 1 proceeds on the lease.
	b.store.fail.Store(true)
	reserveWithin(t, a.node, crypto.Fingerprint{0xee, 0}, 3<<20)
	if st := a.node.Stats(); st.LeaseWaits == 0 {
		t.Error("a reservation the standby could not record returned without a lease wait")
	}
	pairWait(t, "a record error", func() bool { return b.node.Stats().RecordErrors > 0 })
	b.store.fail.Store(false)

	// Node 1's sends fail for a sweep.
	a.conn.fail.Store(true)
	pairWait(t, "a send error", func() bool { return a.node.Stats().SendErrors > 0 })
	a.conn.fail.Store(false)

	// Node 2 takes over while node 1 still acts as active: one state
	// released, one silent, and node 1 hears a split brain.
	pairWait(t, "a fresh report", func() bool { _, ok := b.node.Report(reported.Fingerprint()); return ok })
	if st := b.setRole(t, wire.PairRoleActive); st.Released != 1 || st.Silent != 1 {
		t.Fatalf("takeover: released %d, silent %d; want 1 and 1", st.Released, st.Silent)
	}
	pairWait(t, "a split brain", func() bool { return a.node.Stats().SplitBrain > 0 })

	// Each counter's series lies between the counter read before the
	// scrape and after it.
	counters := map[string]func(pairsync.Stats) uint64{
		"espd_pair_sent_bytes_total{}":     func(s pairsync.Stats) uint64 { return s.SentBytes },
		"espd_pair_received_bytes_total{}": func(s pairsync.Stats) uint64 { return s.RecvBytes },
		"espd_pair_send_errors_total{}":    func(s pairsync.Stats) uint64 { return s.SendErrors },
		"espd_pair_rejected_total{}":       func(s pairsync.Stats) uint64 { return s.Rejected },
		"espd_pair_reflected_total{}":      func(s pairsync.Stats) uint64 { return s.Reflected },
		"espd_pair_replayed_total{}":       func(s pairsync.Stats) uint64 { return s.Replayed },
		"espd_pair_misconfigured_total{}":  func(s pairsync.Stats) uint64 { return s.Misconfigured },
		"espd_pair_forgotten_total{}":      func(s pairsync.Stats) uint64 { return s.Forgotten },
		"espd_pair_split_brain_total{}":    func(s pairsync.Stats) uint64 { return s.SplitBrain },
		"espd_pair_lease_waits_total{}":    func(s pairsync.Stats) uint64 { return s.LeaseWaits },
		"espd_pair_ack_waits_total{}":      func(s pairsync.Stats) uint64 { return s.AckWaits },
		"espd_pair_record_errors_total{}":  func(s pairsync.Stats) uint64 { return s.RecordErrors },
	}
	// The types a node sends (the "other" index of pairsync.Stats' arrays
	// is not exported).
	for _, ty := range []pairsync.Type{pairsync.TypeReserve, pairsync.TypeAck, pairsync.TypeWindows, pairsync.TypeHello, pairsync.TypeOwn} {
		counters[fmt.Sprintf("espd_pair_messages_sent_total{type=%q}", ty)] = func(s pairsync.Stats) uint64 { return s.Sent[ty] }
		counters[fmt.Sprintf("espd_pair_messages_received_total{type=%q}", ty)] = func(s pairsync.Stats) uint64 { return s.Received[ty] }
	}
	var after []series
	for i, n := range nodes {
		lo := n.node.Stats()
		s := scrapeBody(t, func(t *testing.T) string { return scrape(t, n.handler()) })
		hi := n.node.Stats()
		after = append(after, s)
		for key, f := range counters {
			if v, ok := s[key]; !ok || v < float64(f(lo)) || v > float64(f(hi)) {
				t.Errorf("node %d: %s = %v (exported %v), want %d to %d", i+1, key, v, ok, f(lo), f(hi))
			}
		}
		p := n.p
		p.mu.Lock()
		released, silent, stale := p.released, p.silent, p.stale
		p.mu.Unlock()
		if s["espd_pair_takeover_released{}"] != float64(released) || s["espd_pair_takeover_silent{}"] != float64(silent) ||
			s["espd_pair_takeover_stale_windows{}"] != float64(stale) {
			t.Errorf("node %d: takeover released %v, silent %v, stale %v; want %d, %d, %d", i+1, s["espd_pair_takeover_released{}"],
				s["espd_pair_takeover_silent{}"], s["espd_pair_takeover_stale_windows{}"], released, silent, stale)
		}
		if s["espd_pair_role{}"] != float64(n.node.Role()) || n.node.Role() != pairsync.RoleActive {
			t.Errorf("node %d: espd_pair_role = %v, role %v", i+1, s["espd_pair_role{}"], n.node.Role())
		}
		if _, heard := n.node.PeerHeard(); !heard || s["espd_pair_peer_heard_seconds{}"] <= 0 || s["espd_pair_peer_heard_seconds{}"] > 10 {
			t.Errorf("node %d: espd_pair_peer_heard_seconds = %v (heard %v)", i+1, s["espd_pair_peer_heard_seconds{}"], heard)
		}
	}

	// Every series moved on a node.
	moved := map[string]bool{}
	for i := range nodes {
		for key, v := range after[i] {
			name, _, _ := strings.Cut(key, "{")
			if !strings.HasPrefix(name, "espd_pair_") {
				continue
			}
			old, ok := before[i][key]
			moved[key] = moved[key] || (ok && old != v) || (!ok && v != 0)
		}
	}
	for key, m := range moved {
		if !m {
			t.Errorf("did not move on either node: %s", key)
		}
		if strings.Contains(key, `type="other"`) {
			t.Errorf("%s: no message of another type is ever received", key)
		}
	}
	fams, err := parseText(scrape(t, a.handler()))
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range fams {
		if h := f.GetHelp(); strings.HasPrefix(name, "espd_pair_") && (h == "" || !strings.HasSuffix(h, ".")) {
			t.Errorf("%s: help %q is not a sentence", name, h)
		}
	}
}

// noDP is a data plane that counted nothing.
func noDP() dataplane.Stats { return dataplane.Stats{} }

// handler is the /metrics endpoint of n as the daemon wires a pair's.
func (n *pairNode) handler() http.Handler {
	return metrics.New(metrics.Sources{DB: n.db, Dataplane: noDP, Pair: n.p.Metrics})
}

// The scrape checks shared with metrics' and daemon's tests.
var (
	scrape     = metricstest.Scrape
	parseText  = metricstest.ParseText
	scrapeBody = metricstest.ScrapeBody
)

type series = metricstest.Series
