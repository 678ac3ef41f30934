package load

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// TestSeqCounter feeds reordered, lost and duplicated sequences to the
// counter.
func TestSeqCounter(t *testing.T) {
	for _, tc := range []struct {
		seqs                []uint64
		received, reordered uint64
	}{
		{[]uint64{0, 1, 2, 3}, 4, 0},
		{[]uint64{0, 2, 1, 3}, 4, 1},       // 1 came after 2
		{[]uint64{3, 0, 1, 2}, 4, 3},       // 3 overtook all of them
		{[]uint64{0, 1, 5, 6, 7}, 5, 0},    // a gap is loss, not reordering
		{[]uint64{0, 1, 1, 2}, 4, 1},       // a duplicate counts
		{[]uint64{10, 11, 4, 12, 5}, 5, 2}, // late ones of an earlier burst
		{nil, 0, 0},
	} {
		var c SeqCounter
		for _, s := range tc.seqs {
			c.Add(s)
		}
		if c.Received != tc.received || c.Reordered != tc.reordered {
			t.Errorf("%v: received %d reordered %d, want %d and %d", tc.seqs, c.Received, c.Reordered, tc.received, tc.reordered)
		}
	}
}

// TestProbeCount feeds the probe's receiver datagrams of two flows, one of
// them reordered, and one that is not a probe datagram.
func TestProbeCount(t *testing.T) {
	p := &Probe{counts: make([]SeqCounter, 2), sent: make([]uint64, 2)}
	b := make([]byte, probeSize)
	for _, d := range []struct {
		flow uint32
		seq  uint64
	}{{0, 0}, {1, 0}, {0, 1}, {1, 2}, {0, 2}, {1, 1}, {1, 3}, {0, 3}} {
		putProbe(b, d.flow, d.seq)
		p.count(b)
	}
	putProbe(b, 7, 0) // no such flow
	p.count(b)
	p.count([]byte("not a probe datagram"))
	got := p.Snapshot()
	if got[0] != (ProbeCounts{Received: 4}) || got[1] != (ProbeCounts{Received: 4, Reordered: 1}) {
		t.Errorf("counts %+v", got)
	}
	if p.Malformed() != 2 {
		t.Errorf("%d malformed, want 2", p.Malformed())
	}
}

// TestStreamsAndProbe runs three TCP streams between two address pairs
// of a routed line, and the probe over both pairs, and checks that every
// stream moved data and that the probe counted every flow, in order.
func TestStreamsAndProbe(t *testing.T) {
	if err := testbed.Available(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	top := testbed.NewT(t, testbed.Options{Prefix: "ebls", RouteLANs: true})
	var flows []Flow
	for i := range 2 {
		c := netip.MustParseAddr(fmt.Sprintf("198.18.1.%d", 10+i))
		s := netip.MustParseAddr(fmt.Sprintf("198.18.2.%d", 10+i))
		top.Client.MustIP(t, "addr", "add", c.String()+"/32", "dev", testbed.IfHost)
		top.Server.MustIP(t, "addr", "add", s.String()+"/32", "dev", testbed.IfHost)
		flows = append(flows, Flow{Src: c, Dst: s})
	}
	probe, err := StartProbe(ctx, ProbeOptions{From: top.Client, To: top.Server, Flows: flows, Rate: 2000, Burst: 4})
	if err != nil {
		t.Fatal(err)
	}
	var marks []bool
	res, err := Streams(ctx, StreamsOptions{From: top.Client, To: top.Server, Flows: []Flow{flows[0], flows[0], flows[1]},
		MSS: 1000, Omit: 100 * time.Millisecond, Duration: 500 * time.Millisecond,
		Window: func(start bool) { marks = append(marks, start) }})
	probe.Stop(100 * time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for i, b := range res.PerFlow {
		if b <= 0 {
			t.Errorf("stream %d moved %d bytes", i, b)
		}
		sum += b
	}
	if len(res.PerFlow) != 3 || sum != res.Bytes || res.Bitrate() <= 0 || res.MSS == 0 || res.MSS > 1000 || res.Idle != 0 {
		t.Errorf("result %+v", res)
	}
	if len(marks) != 2 || !marks[0] || marks[1] {
		t.Errorf("window marks %v", marks)
	}
	for i, c := range probe.Snapshot() {
		if c.Sent == 0 || c.Received == 0 || c.Received > c.Sent || c.Reordered != 0 {
			t.Errorf("probe flow %d: %+v", i, c)
		}
	}
	if probe.Malformed() != 0 {
		t.Errorf("%d malformed probe datagrams", probe.Malformed())
	}
	t.Logf("3 streams: %.0f Mbit/s, per stream %v, probe %+v", res.Bitrate()/1e6, res.PerFlow, probe.Snapshot())

	// A flow whose source is no address of the client cannot connect.
	bad := []Flow{{Src: netip.MustParseAddr("198.18.1.99"), Dst: flows[0].Dst}}
	if _, err := Streams(ctx, StreamsOptions{From: top.Client, To: top.Server, Flows: bad, Duration: 100 * time.Millisecond}); err == nil {
		t.Error("a stream from an address the client does not have went through")
	}
}
