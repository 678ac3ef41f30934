package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/sa"
	"github.com/espd/espd/seqstore"
	"github.com/espd/espd/testbed"
)

// Sequence numbers across restarts: espd keeps in its --state-dir how far
// each outbound key's sequence numbers may have gone, so that the same SPI
// and key added again after a crash or a restart (manual keying) never
// sends a (key, sequence number) pair twice, which would repeat an AES-GCM
// nonce. The capture of the transit link is the judge.

// seqMarkerPort is the UDP port of the datagram gwA sends to gwB between
// two espd runs: in the capture, which keeps the order of the link, it
// separates what one run sent from what the next sent.
const seqMarkerPort = 9

// seqGateway is espd on gwA across kills and restarts: one state
// directory, a new process (and control socket directory) per run.
type seqGateway struct {
	t     *testing.T
	node  *testbed.Node
	state string
	runs  int
	e     *espd // the current run
}

// start runs espd (again) with the gateway's state directory and waits
// until it is ready.
func (g *seqGateway) start() *espd {
	t := g.t
	t.Helper()
	g.runs++
	dir, err := os.MkdirTemp("", fmt.Sprintf("espd-seq-%s-%d-", g.node.Role, g.runs))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	e := &espd{node: g.node, dir: dir, sock: filepath.Join(dir, "espd.sock")}
	argv := []string{espdBin, "--tun", tunName, "--socket", e.sock, "--state-dir", g.state,
		"--workers", "2", "--udp-port", "4500", "--log-format", "text", "--log-level", "debug"}
	e.proc, err = g.node.Start(filepath.Join(dir, "espd.log"), argv...)
	if err != nil {
		t.Fatal(err)
	}
	run, proc := g.runs, e.proc
	t.Cleanup(func() {
		if done, _ := proc.Exited(); !done {
			if err := proc.Stop(10 * time.Second); err != nil {
				t.Errorf("espd on %s (run %d): %v", g.node.Role, run, err)
			}
		}
		if t.Failed() {
			t.Logf("espd on %s (run %d) logged:\n%s", g.node.Role, run, tail(proc.Log(), 80))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := testbed.WaitEspd(ctx, g.node, proc, e.sock, tunName); err != nil {
		t.Fatalf("espd on %s (run %d): %v\nlog:\n%s", g.node.Role, run, err, tail(proc.Log(), 60))
	}
	g.e = e
	return e
}

// kill sends SIGKILL to the current run and waits until it is gone.
func (g *seqGateway) kill() { g.e.kill(g.t) }

// term stops the current run with SIGTERM and requires a clean exit.
func (g *seqGateway) term() { g.e.term(g.t) }

// seqTunnel is an IPv4 tunnel, raw ESP, keyed by hand with one fixed key
// per direction for the whole test: gwA restarts, gwB does not.
type seqTunnel struct {
	top                  *testbed.Topology
	a                    *seqGateway
	b                    *espd
	aOuter, bOuter       netip.Addr
	aSAs, bSAs           []saSpec
	aPolicies, bPolicies []policySpec
}

func newSeqTunnel(t *testing.T) *seqTunnel {
	t.Helper()
	top := newTopology(t, 0)
	st := &seqTunnel{top: top, a: &seqGateway{t: t, node: top.GwA, state: stateDir(t, top.GwA)},
		aOuter: testbed.GwATransitV4.Addr(), bOuter: testbed.GwBTransitV4.Addr()}
	kl := keyLens["aes128gcm16"]
	ab, ba := randKey(t, kl[0]), randKey(t, kl[0])
	sa := func(spi uint32, dir string, src, dst netip.Addr, key []byte) saSpec {
		return saSpec{spi: spi, dir: dir, src: src, dst: dst, suite: "aes128gcm16", encKey: key, reqid: 1, replayWindow: 64}
	}
	st.aSAs = []saSpec{sa(spiAB, "out", st.aOuter, st.bOuter, ab), sa(spiBA, "in", st.bOuter, st.aOuter, ba)}
	st.bSAs = []saSpec{sa(spiBA, "out", st.bOuter, st.aOuter, ba), sa(spiAB, "in", st.aOuter, st.bOuter, ab)}
	lanA, lanB := testbed.LANAV4, testbed.LANBV4
	st.aPolicies = []policySpec{{src: lanA, dst: lanB, dir: "out", action: "protect", reqid: 1},
		{src: lanB, dst: lanA, dir: "in", action: "protect", reqid: 1}}
	st.bPolicies = []policySpec{{src: lanB, dst: lanA, dir: "out", action: "protect", reqid: 1},
		{src: lanA, dst: lanB, dir: "in", action: "protect", reqid: 1}}
	st.b = startEspd(t, top.GwB)
	keyAllSeq(t, st.b, st.bSAs, st.bPolicies)
	keyAllSeq(t, st.a.start(), st.aSAs, st.aPolicies)
	return st
}

// keyAllSeq installs states and policies on e.
func keyAllSeq(t *testing.T, e *espd, sas []saSpec, ps []policySpec) {
	t.Helper()
	for _, s := range sas {
		e.addSA(t, s)
	}
	for _, p := range ps {
		e.addPolicy(t, p)
	}
}

// startSeqCapture records gwA's transit link: ESP headers and the marker.
func startSeqCapture(t *testing.T, top *testbed.Topology) *testbed.Capture {
	t.Helper()
	c, err := top.GwA.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 96})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Stop() })
	return c
}

// mark sends the marker datagram from gwA across the transit link.
func mark(t *testing.T, top *testbed.Topology) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	dst := netip.AddrPortFrom(testbed.GwBTransitV4.Addr(), seqMarkerPort)
	if _, err := top.GwA.SendUDP(ctx, dst, testbed.UDPSendOptions{Count: 1}); err != nil {
		t.Fatal(err)
	}
}

// seqRuns returns the sequence numbers of the ESP packets gwA sent with
// spi, in the order of the link, one slice per espd run (split at the
// markers), and every (SPI, sequence number) pair that crossed the link
// in either direction more than once.
func seqRuns(frames []testbed.Frame, spi uint32) (runs [][]uint32, dups []string) {
	runs = [][]uint32{nil}
	type pair struct{ spi, seq uint32 }
	seen := map[pair]int{}
	for i := range frames {
		f := &frames[i]
		if f.Outgoing && f.Proto == 17 && f.DstPort == seqMarkerPort {
			runs = append(runs, nil)
			continue
		}
		if f.Class != testbed.ClassESP || (f.Fragment && !f.FirstFragment) {
			continue
		}
		p := pair{f.SPI, f.Seq}
		if seen[p]++; seen[p] == 2 {
			dups = append(dups, fmt.Sprintf("spi 0x%x seq %d", p.spi, p.seq))
		}
		if f.Outgoing && f.SPI == spi {
			runs[len(runs)-1] = append(runs[len(runs)-1], f.Seq)
		}
	}
	return runs, dups
}

// stopSeqCapture stops capt, which must have missed nothing, and returns
// checkSeqs of gwA's outbound state's frames.
func stopSeqCapture(t *testing.T, capt *testbed.Capture) [][]uint32 {
	t.Helper()
	res, err := capt.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if !res.Complete() {
		t.Fatalf("capture incomplete: %s", res.Summary())
	}
	return checkSeqs(t, res.Frames, spiAB)
}

// checkSeqs requires that no (SPI, sequence number) pair crossed the link
// twice and that every run of espd started above everything the runs
// before it sent with spi; it returns the runs.
func checkSeqs(t *testing.T, frames []testbed.Frame, spi uint32) [][]uint32 {
	t.Helper()
	runs, dups := seqRuns(frames, spi)
	if len(dups) > 0 {
		t.Errorf("%d (SPI, sequence number) pairs crossed the transit link twice, e.g. %s", len(dups), strings.Join(dups[:min(len(dups), 5)], ", "))
	}
	var high uint32
	for i, r := range runs {
		if len(r) == 0 {
			continue
		}
		if i > 0 && r[0] <= high {
			t.Errorf("run %d of espd started at sequence number %d, not above %d, the highest before it", i+1, r[0], high)
		}
		for _, s := range r {
			high = max(high, s)
		}
	}
	return runs
}

// runLens returns the number of packets of each run.
func runLens(runs [][]uint32) []int {
	n := make([]int, len(runs))
	for i, r := range runs {
		n[i] = len(r)
	}
	return n
}

// outAfterLastMark counts the ESP packets gwA sent with spi after the last
// marker.
func outAfterLastMark(frames []testbed.Frame, spi uint32) int {
	runs, _ := seqRuns(frames, spi)
	return len(runs[len(runs)-1])
}

// TestSeqRestartKill kills espd on gwA with SIGKILL in the middle of a TCP
// transfer, restarts it with the same state directory and installs the
// same SPIs and keys again: the transfer completes, and no (SPI, sequence
// number) pair crosses the link twice; the restarted espd continues above
// everything its predecessor may have sent, skipping at most what it had
// reserved ahead.
func TestSeqRestartKill(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st := newSeqTunnel(t)
	ping(t, ctx, st.top, testbed.IPv4, false)
	capt := startSeqCapture(t, st.top)

	type result struct {
		r   testbed.TransferResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := pacedTransfer(t, ctx, st.top, testbed.IPv4, true, 8<<20, 2<<20)
		done <- result{r, err}
	}()
	if !eventually(30*time.Second, func() bool { return outAfterLastMark(capt.Frames(), spiAB) >= 400 }) {
		t.Fatalf("the transfer did not get going: %d ESP packets from gwA", outAfterLastMark(capt.Frames(), spiAB))
	}
	select {
	case r := <-done:
		t.Fatalf("the transfer ended before the kill: %v %v", r.r, r.err)
	default:
	}
	st.a.kill()
	mark(t, st.top)
	a := st.a.start()
	keyAllSeq(t, a, st.aSAs, st.aPolicies)

	// The first packets of the new run decide; check them at once.
	if !eventually(30*time.Second, func() bool { return outAfterLastMark(capt.Frames(), spiAB) >= 50 }) &&
		outAfterLastMark(capt.Frames(), spiAB) == 0 {
		t.Fatal("gwA sent nothing with the same SPI and key after its restart")
	}
	checkSeqs(t, capt.Frames(), spiAB)
	if t.Failed() {
		t.FailNow()
	}

	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("transfer across the kill: %v", r.err)
		}
	case <-ctx.Done():
		t.Fatal("transfer across the kill did not end")
	}
	runs := stopSeqCapture(t, capt)
	if n := runLens(runs); len(runs) != 2 || n[0] < 400 || n[1] < 50 {
		t.Fatalf("ESP packets from gwA per run of espd: %v, want 2 runs, at least 400 and 50", n)
	}
	before, after := runs[0], runs[1]
	high := before[len(before)-1]
	for _, s := range before {
		high = max(high, s)
	}
	skipped := uint64(after[0]) - uint64(high) - 1
	t.Logf("killed after sequence number %d (%d packets); the restarted espd sent %d packets from %d: %d numbers skipped (what the dead one had reserved ahead)",
		high, len(before), len(after), after[0], skipped)
	if skipped > 2*sa.DefaultSeqBlock {
		t.Errorf("%d sequence numbers skipped, more than two blocks of %d", skipped, sa.DefaultSeqBlock)
	}
	st.a.e.alive(t)
}

// seqOut is the last sequence number e's outbound state (gwA to gwB) sent.
func (st *seqTunnel) seqOut(t *testing.T, e *espd) uint64 {
	return e.saCounter(t, spiAB, st.bOuter, "stats", "seq_out")
}

// quietSeqOut waits until gwA's outbound state has stopped sending (the
// tail of a transfer is through) and returns its last sequence number,
// which must be a transfer's worth.
func (st *seqTunnel) quietSeqOut(t *testing.T) uint64 {
	t.Helper()
	var last uint64
	eventually(5*time.Second, func() bool {
		n := st.seqOut(t, st.a.e)
		stable := n == last
		last = n
		time.Sleep(300 * time.Millisecond)
		return stable
	})
	if last < 100 {
		t.Fatalf("gwA's outbound state sent %d packets, want a transfer's worth", last)
	}
	return last
}

// TestSeqRestartTerm stops espd on gwA with SIGTERM and installs the same
// SPIs and keys again: the state continues exactly after the last number
// the stopped espd sent.
func TestSeqRestartTerm(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st := newSeqTunnel(t)
	capt := startSeqCapture(t, st.top)
	transfer(t, ctx, st.top, testbed.IPv4, true, smallTransfer)
	seqOut := func(e *espd) uint64 { return st.seqOut(t, e) }
	last := st.quietSeqOut(t)
	for run := 2; run <= 3; run++ {
		st.a.term()
		mark(t, st.top)
		a := st.a.start()
		keyAllSeq(t, a, st.aSAs, st.aPolicies)
		if n := seqOut(a); n != last {
			t.Errorf("run %d: the re-added state starts with seq-out %d, want %d (the last sent before SIGTERM)", run, n, last)
		}
		ping(t, ctx, st.top, testbed.IPv4, false)
		last = seqOut(a)
	}
	runs := stopSeqCapture(t, capt)
	if len(runs) != 3 {
		t.Fatalf("%d runs in the capture, want 3", len(runs))
	}
	for i := 1; i < len(runs); i++ {
		prev, cur := runs[i-1], runs[i]
		if len(prev) == 0 || len(cur) == 0 {
			t.Fatalf("run %d or %d sent nothing with spi 0x%x", i, i+1, spiAB)
		}
		if want := prev[len(prev)-1] + 1; cur[0] != want {
			t.Errorf("run %d started at sequence number %d, want %d: right after the last of run %d", i+1, cur[0], want, i)
		}
	}
}

// TestSeqStoreCorrupt damages gwA's state file while espd is stopped: the
// restarted espd runs, says why it refuses outbound states, refuses the
// outbound state (espctl prints the reason) and accepts and uses the
// inbound one.
func TestSeqStoreCorrupt(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st := newSeqTunnel(t)
	ping(t, ctx, st.top, testbed.IPv4, false)
	st.a.term()

	path := filepath.Join(st.a.state, seqstore.LogName)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const rec = 64 // seqstore's record size
	if len(b) < 3*rec {
		t.Fatalf("%s holds %d bytes, want a header and at least two records", path, len(b))
	}
	b[rec+12] ^= 0x10 // the first record's value: no longer matches its checksum
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}

	a := st.a.start()
	if !eventually(5*time.Second, func() bool { return a.logContains("REFUSING EVERY OUTBOUND SA", path) }) {
		t.Errorf("espd did not log loudly that it refuses outbound states")
	}
	args := st.aSAs[0].args()
	defer removeKeyFiles(args)
	out, err := a.ctl(args...)
	if err == nil {
		t.Fatalf("outbound state added over a corrupt state file:\n%s", out)
	}
	for _, want := range []string{"corrupt", path, fmt.Sprintf("offset %d", rec), "outbound SAs cannot be trusted"} {
		if !strings.Contains(out, want) {
			t.Errorf("espctl's error does not say %q:\n%s", want, out)
		}
	}
	t.Logf("espctl sa add --dir out: %s", strings.TrimSpace(out))
	a.addSA(t, st.aSAs[1])
	for _, p := range st.aPolicies {
		a.addPolicy(t, p)
	}

	// Inbound works: datagrams from the server reach the client.
	const port, n = 40998, 20
	r, err := st.top.Client.ListenUDP(netip.AddrPortFrom(testbed.ClientV4.Addr(), port))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, err := st.top.Server.SendUDP(ctx, netip.AddrPortFrom(testbed.ClientV4.Addr(), port),
		testbed.UDPSendOptions{Count: n, Interval: 5 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	if err := r.WaitPackets(wctx, n); err != nil {
		t.Errorf("inbound through the state added over a corrupt state file: %v", err)
	}
	if got := a.saCounter(t, spiBA, st.aOuter, cntPackets...); got < n {
		t.Errorf("gwA's inbound state counted %d packets, want at least %d", got, n)
	}
	// The damaged file is left for the operator.
	if after, err := os.ReadFile(path); err != nil || string(after) != string(b) {
		t.Errorf("espd changed the damaged state file (%v)", err)
	}
	a.alive(t)
}
