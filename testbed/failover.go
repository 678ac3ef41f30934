package testbed

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FailoverTraffic is the traffic a Pair's failover tests run through it:
// echo requests every 100 ms from the server to the client, each reply
// timed (ping -D), and a TCP transfer from the server to the client paced
// at FailoverRate.
type FailoverTraffic struct {
	Start    time.Time
	Count    int // echo requests sent
	PingOut  string
	PingErr  error
	Xfer     TransferResult
	XferErr  error // the transfer's, or the bytes that did not arrive intact
	pingDone chan struct{}
	xferDone chan struct{}
}

// FailoverRate paces FailoverTraffic's transfer, in bytes per second.
const FailoverRate = 250 << 10

// PingReplyRE matches a reply of ping -D: its time stamp and icmp_seq.
var PingReplyRE = regexp.MustCompile(`(?m)^\[(\d+\.\d+)\] \d+ bytes from [^:]+: icmp_seq=(\d+)`)

// StartFailoverTraffic starts the traffic through p, for about d.
func StartFailoverTraffic(p *Pair, d time.Duration) *FailoverTraffic {
	tr := &FailoverTraffic{Start: time.Now(), Count: int(d / (100 * time.Millisecond)),
		pingDone: make(chan struct{}), xferDone: make(chan struct{})}
	go func() {
		defer close(tr.pingDone)
		ctx, cancel := context.WithTimeout(context.Background(), d+20*time.Second)
		defer cancel()
		tr.PingOut, tr.PingErr = p.Server.Run(ctx, "ping", "-n", "-D", "-O", "-4", "-c", strconv.Itoa(tr.Count), "-i", "0.1", "-W", "1",
			ClientV4.Addr().String())
	}()
	go func() {
		defer close(tr.xferDone)
		n := int64(d.Seconds() * FailoverRate)
		tr.Xfer, tr.XferErr = Transfer(context.Background(), TransferOptions{
			From: p.Server, To: p.Client, Dst: ClientV4.Addr(), Bytes: n, Timeout: d + 60*time.Second,
			Seed: uint64(n), MaxRate: FailoverRate,
		})
		if tr.XferErr == nil && (tr.Xfer.Bytes != n || tr.Xfer.Sent != tr.Xfer.Received) {
			tr.XferErr = fmt.Errorf("%d of %d bytes arrived, intact %v", tr.Xfer.Bytes, n, tr.Xfer.Sent == tr.Xfer.Received)
		}
	}()
	return tr
}

// Wait waits, for 3 minutes at most, until the pings and the transfer end.
func (tr *FailoverTraffic) Wait(tb testing.TB) {
	tb.Helper()
	for _, c := range []chan struct{}{tr.pingDone, tr.xferDone} {
		select {
		case <-c:
		case <-time.After(3 * time.Minute):
			tb.Fatal("testbed: the traffic through the pair did not end")
		}
	}
}

// Check waits for the traffic and requires the transfer complete and
// intact, and the pings: with since zero (no failover) at most 2 lost;
// else answered again within bound of since, then at most 2 lost.
func (tr *FailoverTraffic) Check(tb testing.TB, what string, since time.Time, bound time.Duration) {
	tb.Helper()
	tr.Wait(tb)
	if tr.PingErr != nil && !strings.Contains(tr.PingOut, "packets transmitted") {
		tb.Fatalf("%s: ping from the server: %v\n%s", what, tr.PingErr, tr.PingOut)
	}
	var replies []time.Time
	var seqs []int
	for _, m := range PingReplyRE.FindAllStringSubmatch(tr.PingOut, -1) {
		sec, _ := strconv.ParseFloat(m[1], 64)
		seq, _ := strconv.Atoi(m[2])
		replies = append(replies, time.Unix(0, int64(sec*1e9)))
		seqs = append(seqs, seq)
	}
	tb.Logf("%s: %d of %d echo requests answered; ping:\n%s", what, len(replies), tr.Count, Tail(tr.PingOut, 4))
	if tr.XferErr != nil {
		tb.Errorf("%s: the TCP transfer failed: %v (%v)", what, tr.XferErr, tr.Xfer)
	} else {
		tb.Logf("%s: TCP transfer %v", what, tr.Xfer)
	}
	if since.IsZero() {
		if lost := tr.Count - len(replies); lost > 2 {
			tb.Errorf("%s: %d of %d echo requests lost without a failover", what, lost, tr.Count)
		}
		return
	}
	first := -1
	for i, at := range replies {
		if at.After(since) {
			first = i
			break
		}
	}
	if first < 0 {
		tb.Errorf("%s: no echo request answered after it", what)
		return
	}
	gap := replies[first].Sub(since)
	var last time.Time
	if first > 0 {
		last = replies[first-1]
	}
	tb.Logf("%s: the first reply came %v after it (icmp_seq %d; the last one before: %v before it)",
		what, gap.Round(time.Millisecond), seqs[first], since.Sub(last).Round(time.Millisecond))
	if gap > bound {
		tb.Errorf("%s: traffic resumed %v after it, more than %v", what, gap, bound)
	}
	if lost := (tr.Count - seqs[first]) - (len(replies) - 1 - first); lost > 2 {
		tb.Errorf("%s: %d echo requests lost after traffic resumed", what, lost)
	}
}
