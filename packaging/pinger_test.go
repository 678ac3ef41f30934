package packaging

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// waitPassing waits up to timeout until every pinger has had an answer to
// a request sent after since.
func waitPassing(pingers []*pinger, since time.Time, timeout time.Duration) bool {
	return testbed.Poll(timeout, 100*time.Millisecond, func() bool {
		for _, p := range pingers {
			if p.update(); p.repliesSince(since) == 0 {
				return false
			}
		}
		return true
	})
}

// lanPingers starts pinging between the LAN hosts of top, both ways, IPv4
// and IPv6: the client to the server, then the server to the client.
func lanPingers(t *testing.T, top *testbed.Topology) []*pinger {
	dir := t.TempDir()
	return []*pinger{
		startPinger(t, top.Client, dir, testbed.ServerV4.Addr()),
		startPinger(t, top.Client, dir, testbed.ServerV6.Addr()),
		startPinger(t, top.Server, dir, testbed.ClientV4.Addr()),
		startPinger(t, top.Server, dir, testbed.ClientV6.Addr()),
	}
}

// pinger is a ping that runs in the background for the whole test, 20
// requests a second (at most 15 minutes), and the times of its requests
// that were answered, from its output.
type pinger struct {
	name string
	node *testbed.Node
	dir  string
	dst  netip.Addr
	runs int              // pings started
	log  string           // the current ping's output
	proc *testbed.Process // the current ping
	off  int
	// sent holds the send times of the answered requests (reply time less
	// the round trip), answers the same with their ping and icmp_seq;
	// last is the latest time ping said it sent one.
	sent    []time.Time
	answers []answer
	last    time.Time
}

// answer is an answered request: the ping that sent it (pinger.runs), its
// icmp_seq and when it was sent.
type answer struct {
	run, seq int
	sent     time.Time
}

// startPinger starts pinging dst from n.
func startPinger(t *testing.T, n *testbed.Node, dir string, dst netip.Addr) *pinger {
	t.Helper()
	p := &pinger{name: n.Role + "->" + dst.String(), node: n, dir: dir, dst: dst}
	p.start(t)
	return p
}

// start starts a ping with a log of its own.
func (p *pinger) start(t *testing.T) {
	t.Helper()
	fam := "-4"
	if p.dst.Is6() {
		fam = "-6"
	}
	p.runs++
	p.log = filepath.Join(p.dir, fmt.Sprintf("ping-%s-%s-%d.log", p.node.Role, p.dst, p.runs))
	p.off = 0
	// -D: a time stamp on each line; -O: a line for each request not
	// answered before the next one is sent. -c bounds it, not -w: with a
	// deadline iputils ping ends at the first ICMP error it receives, and
	// a gateway that reboots may send one.
	proc, err := p.node.Start(p.log, "ping", fam, "-n", "-D", "-O", "-i", "0.05", "-c", "18000", p.dst.String())
	if err != nil {
		t.Fatal(err)
	}
	p.proc = proc
	t.Cleanup(func() { proc.Stop(5 * time.Second) })
}

// revive starts the ping again if it has ended or has said nothing for
// pingerStall, and says so: the traffic is the test's instrument, and
// recovery is measured by the replies to requests sent since an event,
// whichever ping sent them.
func (p *pinger) revive(t *testing.T) {
	t.Helper()
	p.update()
	done, err := p.proc.Exited()
	stalled := !p.last.IsZero() && time.Since(p.last) > pingerStall
	if !done && !stalled {
		return
	}
	why := fmt.Sprintf("exited (%v)", err)
	if !done {
		why = fmt.Sprintf("has sent nothing since %s", p.last.Format("15:04:05.000"))
	}
	t.Logf("%s: ping %s; its output ends:\n%s\nstarting it again", p.name, why, testbed.Tail(p.proc.Log(), 10))
	p.proc.Stop(5 * time.Second)
	p.start(t)
}

var (
	pingReply   = regexp.MustCompile(`^\[(\d+)\.(\d+)\] \d+ bytes from .* icmp_seq=(\d+) .*time=([0-9.]+) ms`)
	pingNoReply = regexp.MustCompile(`^\[(\d+)\.(\d+)\] no answer yet`)
)

// pingerStall is how long a running ping may go without a line (it writes
// one for every request, 20 a second) before revive restarts it.
const pingerStall = 3 * time.Second

// update reads what ping wrote since the last call.
func (p *pinger) update() {
	b, err := os.ReadFile(p.log)
	if err != nil || len(b) <= p.off {
		return
	}
	b = b[p.off:]
	n := bytes.LastIndexByte(b, '\n') + 1
	p.off += n
	for _, l := range strings.Split(string(b[:n]), "\n") {
		if m := pingReply.FindStringSubmatch(l); m != nil {
			rtt, _ := strconv.ParseFloat(m[4], 64)
			at := stamp(m[1], m[2]).Add(-time.Duration(rtt * float64(time.Millisecond)))
			seq, _ := strconv.Atoi(m[3])
			p.sent = append(p.sent, at)
			p.answers = append(p.answers, answer{run: p.runs, seq: seq, sent: at})
			p.seen(at)
		} else if m := pingNoReply.FindStringSubmatch(l); m != nil {
			p.seen(stamp(m[1], m[2]))
		}
	}
}

// seen records that ping sent a request at.
func (p *pinger) seen(at time.Time) {
	if at.After(p.last) {
		p.last = at
	}
}

// stamp is ping -D's time stamp, seconds and microseconds.
func stamp(sec, usec string) time.Time {
	s, _ := strconv.ParseInt(sec, 10, 64)
	u, _ := strconv.ParseInt((usec + "000000")[:6], 10, 64)
	return time.Unix(s, u*1000)
}

// repliesSince returns how many requests sent after since were answered.
func (p *pinger) repliesSince(since time.Time) int {
	n := 0
	for _, s := range p.sent {
		if s.After(since) {
			n++
		}
	}
	return n
}

// lastReply returns the send time of the last answered request.
func (p *pinger) lastReply() time.Time {
	var last time.Time
	for _, s := range p.sent {
		if s.After(last) {
			last = s
		}
	}
	return last
}

// sentAfter reports whether ping has sent a request after at (answered or
// not, as far as its output says).
func (p *pinger) sentAfter(at time.Time) bool { return p.last.After(at) }

// longestSilence returns the longest time within [from, to) in which no
// request that was answered was sent.
func (p *pinger) longestSilence(from, to time.Time) time.Duration {
	p.update()
	var in []time.Time
	for _, s := range p.sent {
		if !s.Before(from) && s.Before(to) {
			in = append(in, s)
		}
	}
	slices.SortFunc(in, func(a, b time.Time) int { return a.Compare(b) })
	prev, gap := from, time.Duration(0)
	for _, s := range append(in, to) {
		gap = max(gap, s.Sub(prev))
		prev = s
	}
	return gap
}

// missed returns how many requests went unanswered among those sent in
// [from, to] (by icmp_seq, between the last request answered before from
// and the first answered after to), and how many were answered. ok is
// false unless requests sent before from and after to were answered, by
// one ping: the window is then bounded by passing traffic.
func (p *pinger) missed(from, to time.Time) (missed, answered int, ok bool) {
	p.update()
	seqs := map[int]bool{}
	before, after := -1, -1
	for _, a := range p.answers {
		switch {
		case a.sent.Before(from):
			if a.run == p.runs {
				before = max(before, a.seq)
			}
		case a.sent.After(to):
			if a.run == p.runs && (after < 0 || a.seq < after) {
				after = a.seq
			}
		case a.run != p.runs:
			return 0, 0, false // the ping was started again in the window
		default:
			seqs[a.seq] = true
		}
	}
	if before < 0 || after < 0 {
		return 0, len(seqs), false
	}
	for s := before + 1; s < after; s++ {
		if !seqs[s] {
			missed++
		}
	}
	return missed, len(seqs), true
}

// state says whether the ping still runs and, if it has ended, how, with
// the end of its output.
func (p *pinger) state() string {
	if done, err := p.proc.Exited(); done {
		return fmt.Sprintf("exited (%v); its output ends:\n%s", err, testbed.Tail(p.proc.Log(), 10))
	}
	return "running"
}
