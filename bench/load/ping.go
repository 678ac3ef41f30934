package load

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"time"

	"github.com/espd/espd/testbed"
)

// RTT is what ping reported about the round-trip time.
type RTT struct {
	Min, Avg, Max, Mdev   time.Duration
	Transmitted, Received int
}

var rttLine = regexp.MustCompile(`= ([0-9.]+)/([0-9.]+)/([0-9.]+)/([0-9.]+) ms`)

// ParseRTT reads the summary of iputils ping: the counts and the
// "rtt min/avg/max/mdev = a/b/c/d ms" line.
func ParseRTT(out string) (RTT, error) {
	m := rttLine.FindStringSubmatch(out)
	if m == nil {
		return RTT{}, fmt.Errorf("load: no rtt summary in ping output %q", out)
	}
	var v [4]time.Duration
	for i := range v {
		f, err := strconv.ParseFloat(m[i+1], 64)
		if err != nil {
			return RTT{}, fmt.Errorf("load: rtt %q: %w", m[i+1], err)
		}
		v[i] = time.Duration(f * float64(time.Millisecond))
	}
	return RTT{Min: v[0], Avg: v[1], Max: v[2], Mdev: v[3]}, nil
}

// Ping sends count echo requests 20 ms apart from node to dst over an idle
// path and returns the round-trip times; every request must be answered.
func Ping(ctx context.Context, node *testbed.Node, dst netip.Addr, count int) (RTT, error) {
	r, err := node.Ping(ctx, dst, testbed.PingOptions{Count: count, Interval: 20 * time.Millisecond, Wait: time.Second})
	if err != nil {
		return RTT{}, err
	}
	if !r.OK() {
		return RTT{}, fmt.Errorf("load: ping %v from %s: %d of %d answered", dst, node.Role, r.Received, r.Transmitted)
	}
	rtt, err := ParseRTT(r.Output)
	rtt.Transmitted, rtt.Received = r.Transmitted, r.Received
	return rtt, err
}
