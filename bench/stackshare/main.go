// Command stackshare reads the output of `perf script -F tid,ip,sym` and
// prints, for each function named on its command line, the share of the
// samples whose call stack passes through it (a sample counts under every
// function on its stack), and for the samples in the network receive
// softirq (net_rx_action), which system call it interrupted and what it
// delivered. docs/benchmarks-history.md ("Where the rest goes") uses it on
// one gateway's samples:
//
//	perf script -i perf.data --pid PID -F tid,ip,sym > gw.txt
//	go run ./bench/stackshare gw.txt raw_sendmsg io_write tun_do_read tcp_v4_rcv
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"
)

// softirqEntry marks the samples in the receive softirq.
const softirqEntry = "net_rx_action"

// triggers are the system calls in which the softirq runs (on the caller's
// side of net_rx_action), delivered what it delivers (on the callee side).
var (
	triggers  = []string{"raw_sendmsg", "udp_sendmsg", "io_write", "tun_get_user", "tun_do_read", "__sys_recvmmsg"}
	delivered = []string{"raw_local_deliver", "udp_rcv", "tcp_v4_rcv", "tun_net_xmit", "ip_forward"}
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: stackshare PERF-SCRIPT-OUTPUT [FUNCTION...]")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer f.Close()
	r, err := count(f, os.Args[2:])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	r.print(os.Stdout)
}

// result holds the counts of one input.
type result struct {
	samples int
	funcs   []string
	in      map[string]int // samples whose stack holds the function
	softirq map[[2]string]int
}

// count reads perf script's samples: a header line, then one line per
// stack frame ("ADDRESS SYMBOL"), innermost first, then a blank line.
func count(r io.Reader, funcs []string) (*result, error) {
	res := &result{funcs: funcs, in: map[string]int{}, softirq: map[[2]string]int{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var frames []string
	header := true
	flush := func() {
		if len(frames) > 0 {
			res.add(frames)
		}
		frames, header = frames[:0], true
	}
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "":
			flush()
		case header:
			header = false
		default:
			fields := strings.Fields(line)
			frames = append(frames, strings.TrimSuffix(fields[len(fields)-1], ".abi0"))
		}
	}
	flush()
	return res, sc.Err()
}

func (res *result) add(frames []string) {
	res.samples++
	for _, fn := range res.funcs {
		for _, fr := range frames {
			if fr == fn {
				res.in[fn]++
				break
			}
		}
	}
	for i, fr := range frames {
		if fr != softirqEntry {
			continue
		}
		res.softirq[[2]string{first(frames[i:], triggers), first(frames[:i], delivered)}]++
		break
	}
}

// first returns the first of names found in frames, or "other".
func first(frames, names []string) string {
	for _, n := range names {
		for _, fr := range frames {
			if fr == n {
				return n
			}
		}
	}
	return "other"
}

func (res *result) print(w io.Writer) {
	fmt.Fprintf(w, "%d samples\n", res.samples)
	if res.samples == 0 {
		return
	}
	pct := func(n int) float64 { return 100 * float64(n) / float64(res.samples) }
	for _, fn := range res.funcs {
		fmt.Fprintf(w, "%-24s %5.1f%%\n", fn, pct(res.in[fn]))
	}
	for _, t := range append(triggers, "other") {
		for _, d := range append(delivered, "other") {
			if n := res.softirq[[2]string{t, d}]; n > 0 {
				fmt.Fprintf(w, "softirq in %-16s delivering %-18s %5.1f%%\n", t, d, pct(n))
			}
		}
	}
}
