package testbed

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"time"
)

// PingOptions tune Node.Ping. The zero value sends 3 echo requests 200 ms
// apart and waits up to 2 s for each reply.
type PingOptions struct {
	// Count is the number of echo requests (ping -c); 0 means 3.
	Count int
	// Interval separates them (ping -i); 0 means 200 ms.
	Interval time.Duration
	// Wait is how long to wait for each reply (ping -W); 0 means 2 s.
	Wait time.Duration
	// Size is the ICMP payload size (ping -s); 0 leaves ping's default.
	Size int
	// DontFragment sets DF and forbids local fragmentation (ping -M do).
	DontFragment bool
	// Source, if valid, is the source address (ping -I).
	Source netip.Addr
}

// PingResult is what ping reported.
type PingResult struct {
	Transmitted, Received int
	// Output is ping's whole output, for logs.
	Output string
}

// OK reports whether every request got a reply.
func (r PingResult) OK() bool { return r.Transmitted > 0 && r.Received == r.Transmitted }

var pingStats = regexp.MustCompile(`(\d+) packets transmitted, (\d+) (?:packets )?received`)

// Ping runs the system ping (iputils) in the namespace towards dst. It
// returns an error only when ping could not run or its summary could not be
// read; lost replies show in the result (see PingResult.OK). It sends
// exactly Count requests (no -w, which would make ping send until Count
// replies came), and a timeout of Count*Interval+Wait plus a margin kills
// it if it hangs.
func (n *Node) Ping(ctx context.Context, dst netip.Addr, o PingOptions) (PingResult, error) {
	if o.Count <= 0 {
		o.Count = 3
	}
	if o.Interval <= 0 {
		o.Interval = 200 * time.Millisecond
	}
	if o.Wait <= 0 {
		o.Wait = 2 * time.Second
	}
	deadline := time.Duration(o.Count)*o.Interval + o.Wait + time.Second
	args := []string{"ping", "-n",
		"-c", strconv.Itoa(o.Count),
		"-i", strconv.FormatFloat(o.Interval.Seconds(), 'f', 3, 64),
		"-W", strconv.FormatFloat(o.Wait.Seconds(), 'f', 3, 64),
	}
	if dst.Is6() {
		args = append(args, "-6")
	} else {
		args = append(args, "-4")
	}
	if o.Size > 0 {
		args = append(args, "-s", strconv.Itoa(o.Size))
	}
	if o.DontFragment {
		args = append(args, "-M", "do")
	}
	if o.Source.IsValid() {
		args = append(args, "-I", o.Source.String())
	}
	args = append(args, dst.String())
	ctx, cancel := context.WithTimeout(ctx, deadline+5*time.Second)
	defer cancel()
	out, err := n.Run(ctx, args...)
	res := PingResult{Output: out}
	m := pingStats.FindStringSubmatch(out)
	if m == nil {
		return res, fmt.Errorf("testbed: ping %s from %s: no summary: %v", dst, n.Role, err)
	}
	res.Transmitted, _ = strconv.Atoi(m[1])
	res.Received, _ = strconv.Atoi(m[2])
	return res, nil
}
