package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// Fail closed: while an outbound policy is installed, nothing it matches
// crosses the transit link in clear, whatever happens to espd (killed,
// stopped with SIGTERM, restarting), on a gateway whose main table has a
// default route towards the transit link, as every real gateway has.

// fcGateway is espd on one gateway across kills and restarts: one
// directory and control socket, a new process per run.
type fcGateway struct {
	t         *testing.T
	node      *testbed.Node
	dir, sock string
	runs      int
	e         *espd // the current run
}

func newFCGateway(t *testing.T, node *testbed.Node) *fcGateway {
	t.Helper()
	dir, err := os.MkdirTemp("", "espd-fc-"+node.Role+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return &fcGateway{t: t, node: node, dir: dir, sock: filepath.Join(dir, "espd.sock")}
}

// start runs espd (again) and waits until it is ready.
func (g *fcGateway) start() *espd {
	t := g.t
	t.Helper()
	g.runs++
	argv := []string{espdBin, "--tun", tunName, "--socket", g.sock, "--state-dir", stateDir(t, g.node),
		"--workers", "2", "--udp-port", "4500", "--log-format", "text", "--log-level", "debug"}
	proc, err := g.node.Start(filepath.Join(g.dir, fmt.Sprintf("espd-%d.log", g.runs)), argv...)
	if err != nil {
		t.Fatal(err)
	}
	run := g.runs
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
	if err := testbed.WaitEspd(ctx, g.node, proc, g.sock, tunName); err != nil {
		t.Fatalf("espd on %s (run %d): %v\nlog:\n%s", g.node.Role, run, err, tail(proc.Log(), 60))
	}
	g.e = &espd{node: g.node, dir: g.dir, sock: g.sock, proc: proc}
	return g.e
}

// kill sends SIGKILL to the current run and waits until it is gone.
func (g *fcGateway) kill() { g.e.kill(g.t) }

// term stops the current run with SIGTERM and requires a clean exit.
func (g *fcGateway) term() { g.e.term(g.t) }

// fcKeys are one generation of the tunnel's states: fresh random keys and
// SPIs of their own, so that no key is ever installed twice.
type fcKeys struct {
	a, b []saSpec
}

func newFCKeys(t *testing.T, gen uint32) fcKeys {
	t.Helper()
	aOuter, bOuter := testbed.GwATransitV4.Addr(), testbed.GwBTransitV4.Addr()
	ab, ba := randKey(t, keyLens["aes128gcm16"][0]), randKey(t, keyLens["aes128gcm16"][0])
	spiab, spiba := spiAB+gen<<8, spiBA+gen<<8
	sa := func(spi uint32, dir string, src, dst netip.Addr, key []byte) saSpec {
		return saSpec{spi: spi, dir: dir, src: src, dst: dst, suite: "aes128gcm16", encKey: key, reqid: 1, replayWindow: 64}
	}
	return fcKeys{
		a: []saSpec{sa(spiab, "out", aOuter, bOuter, ab), sa(spiba, "in", bOuter, aOuter, ba)},
		b: []saSpec{sa(spiba, "out", bOuter, aOuter, ba), sa(spiab, "in", aOuter, bOuter, ab)},
	}
}

// fcPolicies are a gateway's policies for both LAN families.
func fcPolicies(local, remote [2]netip.Prefix) []policySpec {
	var ps []policySpec
	for i := range local {
		ps = append(ps,
			policySpec{src: local[i], dst: remote[i], dir: "out", action: "protect", reqid: 1},
			policySpec{src: remote[i], dst: local[i], dir: "in", action: "protect", reqid: 1})
	}
	return ps
}

var (
	fcLANA = [2]netip.Prefix{testbed.LANAV4, testbed.LANAV6}
	fcLANB = [2]netip.Prefix{testbed.LANBV4, testbed.LANBV6}
)

// keyAll installs states and policies on e.
func keyAll(t *testing.T, e *espd, sas []saSpec, ps []policySpec) {
	t.Helper()
	for _, s := range sas {
		e.addSA(t, s)
	}
	for _, p := range ps {
		e.addPolicy(t, p)
	}
}

// rekeyB replaces gwB's states with a new generation's.
func rekeyB(t *testing.T, b *espd, k fcKeys) {
	t.Helper()
	b.mustCtl(t, "sa", "flush")
	for _, s := range k.b {
		b.addSA(t, s)
	}
}

// defaultRoutes gives gwA's main table default routes through gwB, which
// forwards to LAN B: a packet that escapes espd's table reaches the server
// in clear.
func defaultRoutes(t *testing.T, top *testbed.Topology) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, args := range [][]string{
		{"-4", "route", "add", "default", "via", testbed.GwBTransitV4.Addr().String()},
		{"-6", "route", "add", "default", "via", testbed.GwBTransitV6.Addr().String()},
	} {
		if _, err := top.GwA.IP(ctx, args...); err != nil {
			t.Fatal(err)
		}
	}
}

// udpStream sends datagrams from the client to the server, alternately over
// IPv4 and IPv6, one every interval, until stopped or max are sent.
type udpStream struct {
	sent, errs atomic.Int64
	recv       [2]*testbed.UDPReceiver
	cancel     context.CancelFunc
	done       chan struct{}
}

const fcPort = 40999

func startStream(t *testing.T, top *testbed.Topology, interval time.Duration, max int) *udpStream {
	t.Helper()
	return startStreamPort(t, top, fcPort, interval, max)
}

// startStreamPort is startStream to another server port.
func startStreamPort(t *testing.T, top *testbed.Topology, port uint16, interval time.Duration, max int) *udpStream {
	t.Helper()
	s := &udpStream{done: make(chan struct{})}
	var conns [2]*net.UDPConn
	for i, f := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		r, err := top.Server.ListenUDP(netip.AddrPortFrom(serverAddr(f), port))
		if err != nil {
			t.Fatal(err)
		}
		s.recv[i] = r
		t.Cleanup(func() { r.Close() })
		dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(serverAddr(f), port))
		err = top.Client.Do(func() (err error) {
			conns[i], err = net.DialUDP("udp", nil, dst)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	s.cancel = cancel
	payload := []byte("espd fail-closed probe: cleartext of this must never reach the transit link")
	go func() {
		defer close(s.done)
		defer conns[0].Close()
		defer conns[1].Close()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for i := 0; i < max; i++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if _, err := conns[i%2].Write(payload); err != nil {
				s.errs.Add(1)
			}
			s.sent.Add(1)
		}
	}()
	t.Cleanup(s.stop)
	return s
}

func (s *udpStream) stop() {
	s.cancel()
	<-s.done
}

func (s *udpStream) received() uint64 { return s.recv[0].Packets() + s.recv[1].Packets() }

// waitReceived waits until the server has n more datagrams than it had.
func (s *udpStream) waitReceived(t *testing.T, more uint64, d time.Duration, what string) {
	t.Helper()
	from := s.received()
	if !eventually(d, func() bool { return s.received() >= from+more }) {
		t.Fatalf("%s: the server received %d datagrams in %v, want %d", what, s.received()-from, d, more)
	}
}

// fcCheck stops the capture and requires no cleartext of the LANs on the
// transit link and ESP from gwA both before from and after to.
func fcCheck(t *testing.T, c *testbed.Capture, from, to time.Time) {
	t.Helper()
	res, err := c.Stop()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("gwA transit: %s", res.Summary())
	if !res.Complete() {
		t.Errorf("capture incomplete: %d dropped, %d over the limit", res.Drops, res.Overflow)
	}
	inner := []netip.Addr{clientAddr(testbed.IPv4), serverAddr(testbed.IPv4), clientAddr(testbed.IPv6), serverAddr(testbed.IPv6)}
	leaks := res.Leaks(inner...)
	for i, f := range leaks {
		if i == 10 {
			break
		}
		t.Errorf("cleartext on transit at %s: %s", f.Time.Format("15:04:05.000"), f.String())
	}
	if len(leaks) > 0 {
		t.Errorf("%d cleartext frames on the transit link (espd down %s - %s)", len(leaks),
			from.Format("15:04:05.000"), to.Format("15:04:05.000"))
	}
	var before, after int
	for i := range res.Frames {
		f := &res.Frames[i]
		if f.Class != testbed.ClassESP || !f.Outgoing {
			continue
		}
		if f.Time.Before(from) {
			before++
		}
		if f.Time.After(to) {
			after++
		}
	}
	t.Logf("ESP from gwA: %d frames before espd went down, %d after it was back", before, after)
	if before == 0 || after == 0 {
		t.Errorf("ESP from gwA: %d frames before, %d after; want some of each", before, after)
	}
}

// heldRoutes requires gwA's table to hold both LAN B prefixes with
// blackhole routes and to route nothing into a TUN, and the rules to be
// there.
func heldRoutes(t *testing.T, n *testbed.Node, when string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tun, rules, routes := kernelState(t, ctx, n)
	all := strings.Join(routes, "\n")
	if tun || !lanARules(rules) || !strings.Contains(all, "blackhole "+testbed.LANBV4.String()) ||
		!strings.Contains(all, "blackhole "+testbed.LANBV6.String()) || strings.Contains(all, "dev "+tunName) {
		t.Errorf("%s: TUN %v, rules %q, routes %q; want no TUN, both rules and blackholes for LAN B", when, tun, rules, all)
	}
}

// failClosed runs the whole sequence with stop taking espd down on gwA.
// fcKeyed is the fail-closed tests' start: both gateways keyed, gwA with
// default routes toward the transit link, whose capture runs until the
// test stops it (c set to nil) or ends.
type fcKeyed struct {
	top *testbed.Topology
	a   *fcGateway
	b   *espd
	c   *testbed.Capture
}

func newFCKeyed(t *testing.T) *fcKeyed {
	t.Helper()
	f := &fcKeyed{top: newTopology(t, 0)}
	defaultRoutes(t, f.top)
	f.a = newFCGateway(t, f.top.GwA)
	ea := f.a.start()
	f.b = startEspd(t, f.top.GwB)
	k := newFCKeys(t, 0)
	keyAll(t, ea, k.a, fcPolicies(fcLANA, fcLANB))
	keyAll(t, f.b, k.b, fcPolicies(fcLANB, fcLANA))
	c, err := f.top.GwA.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 256})
	if err != nil {
		t.Fatal(err)
	}
	f.c = c
	t.Cleanup(func() {
		if f.c != nil {
			f.c.Stop()
		}
	})
	return f
}

func failClosed(t *testing.T, how string, stop func(g *fcGateway)) {
	f := newFCKeyed(t)
	top, a, b, c := f.top, f.a, f.b, f.c
	// 500 datagrams a second, for at most 60 s.
	s := startStream(t, top, 2*time.Millisecond, 30000)
	s.waitReceived(t, 200, 20*time.Second, "before "+how)

	sentBefore := s.sent.Load()
	down := time.Now()
	stop(a)
	heldRoutes(t, top.GwA, "espd down after "+how)
	time.Sleep(time.Second)
	heldRoutes(t, top.GwA, "a second later")
	ea := a.start()
	up := time.Now()
	during := s.sent.Load() - sentBefore
	t.Logf("%s: espd on gwA down for %v; the client sent %d datagrams meanwhile", how, up.Sub(down).Round(time.Millisecond), during)
	if during < 200 {
		t.Errorf("only %d datagrams sent while espd was down; the outage proves nothing", during)
	}
	k := newFCKeys(t, 1)
	keyAll(t, ea, k.a, fcPolicies(fcLANA, fcLANB))
	rekeyB(t, b, k)
	s.waitReceived(t, 200, 20*time.Second, "after the restart")
	s.stop()
	if n := s.errs.Load(); n > 0 {
		t.Logf("%d sends failed on the client", n)
	}
	fcCheck(t, c, down, up)
	f.c = nil
}

// TestFailClosedKill kills espd on gwA with SIGKILL in the middle of a
// stream, leaves it down for a second with the stream still flowing,
// starts it again and keys both sides anew: not one cleartext frame on the
// transit link over the whole sequence, and ESP before and after.
func TestFailClosedKill(t *testing.T) {
	failClosed(t, "SIGKILL", (*fcGateway).kill)
}

// TestFailClosedTerm is TestFailClosedKill with SIGTERM, the orderly stop,
// with the policies installed: the states go (keys zeroed) and the TUN
// with them, the holds and rules stay.
func TestFailClosedTerm(t *testing.T) {
	failClosed(t, "SIGTERM", (*fcGateway).term)
}

// TestFailClosedNothingLeftBehind: with its policies flushed by their
// owner, SIGTERM leaves nothing of espd in the kernel; after a SIGKILL with
// policies installed, "espd --cleanup" (refused while espd runs) removes
// what it left.
func TestFailClosedNothingLeftBehind(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	top := newTopology(t, 0)
	a := newFCGateway(t, top.GwA)
	empty := func(when string) {
		t.Helper()
		tun, rules, routes := kernelState(t, ctx, top.GwA)
		if tun || len(rules) > 0 || len(routes) > 0 {
			t.Errorf("%s: TUN %v, rules %q, routes %q left behind", when, tun, rules, routes)
		}
	}

	e := a.start()
	keyAll(t, e, newFCKeys(t, 0).a, fcPolicies(fcLANA, fcLANB))
	e.mustCtl(t, "policy", "add", "--src", testbed.LANAV4.String(), "--dst", testbed.TransitV4.String(),
		"--dir", "out", "--action", "bypass")
	e.mustCtl(t, "policy", "flush")
	e.mustCtl(t, "sa", "flush")
	a.term()
	empty("policies flushed, then SIGTERM")

	e = a.start()
	keyAll(t, e, newFCKeys(t, 1).a, fcPolicies(fcLANA, fcLANB))
	cleanup := func() (string, error) {
		return top.GwA.Run(ctx, espdBin, "--cleanup", "--socket", a.sock, "--tun", tunName, "--state-dir", stateDir(t, top.GwA))
	}
	out, err := cleanup()
	if err == nil || !strings.Contains(out, "running") {
		t.Errorf("--cleanup with espd running: %v\n%s\nwant a refusal", err, out)
	}
	a.e.alive(t)
	_, _, routes := kernelState(t, ctx, top.GwA)
	if !strings.Contains(strings.Join(routes, "\n"), "dev "+tunName) {
		t.Errorf("--cleanup touched a running espd's routes: %q", routes)
	}

	a.kill()
	heldRoutes(t, top.GwA, "after SIGKILL")
	out, err = cleanup()
	if err != nil {
		t.Fatalf("--cleanup after SIGKILL: %v\n%s", err, out)
	}
	t.Logf("espd --cleanup:\n%s", out)
	for _, want := range []string{"removed rule inet pref", "removed rule inet6 pref", "removed route blackhole " + testbed.LANBV4.String(),
		"removed route blackhole " + testbed.LANBV6.String()} {
		if !strings.Contains(out, want) {
			t.Errorf("--cleanup did not say %q", want)
		}
	}
	empty("--cleanup after SIGKILL")
	out, err = cleanup()
	if err != nil || !strings.Contains(out, "nothing to remove") {
		t.Errorf("second --cleanup: %v\n%s", err, out)
	}
}

// TestFailClosedReboot: the kernel forgets espd's holds and rules at a
// reboot. espd records the held prefixes in its state directory, and
// "espd --restore-holds", run at boot before the LAN's traffic can flow
// (espd-holds.service, before network-pre.target), puts them back: from
// the power loss (SIGKILL, then the table and rules emptied) through the
// boot, espd's start and until both gateways are keyed again, not one
// cleartext frame reaches the transit link.
func TestFailClosedReboot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	f := newFCKeyed(t)
	top, a, b, c := f.top, f.a, f.b, f.c
	s := startStream(t, top, 2*time.Millisecond, 30000)
	s.waitReceived(t, 200, 20*time.Second, "before the power loss")
	s.stop()

	down := time.Now()
	a.kill()
	// The reboot: the kernel's table and rules are gone.
	for _, fam := range []string{"-4", "-6"} {
		if _, err := top.GwA.IP(ctx, fam, "route", "flush", "table", fmt.Sprint(espdTable)); err != nil {
			t.Fatal(err)
		}
		for _, pref := range []int{espdPriority - 1, espdPriority, espdPriority + 1} {
			for {
				if _, err := top.GwA.IP(ctx, fam, "rule", "del", "pref", fmt.Sprint(pref)); err != nil {
					break
				}
			}
		}
	}
	if _, rules, routes := kernelState(t, ctx, top.GwA); len(rules)+len(routes) > 0 {
		t.Fatalf("the reboot left rules %q, routes %q", rules, routes)
	}
	out, err := top.GwA.Run(ctx, espdBin, "--restore-holds", "--state-dir", stateDir(t, top.GwA))
	if err != nil {
		t.Fatalf("espd --restore-holds: %v\n%s", err, out)
	}
	t.Logf("espd --restore-holds:\n%s", out)
	heldRoutes(t, top.GwA, "after --restore-holds")

	// The LAN's traffic starts with the boot; espd starts later, and is
	// keyed later still.
	s = startStreamPort(t, top, fcPort+1, 2*time.Millisecond, 30000)
	if !eventually(20*time.Second, func() bool { return s.sent.Load() >= 300 }) {
		t.Fatal("the client sent nothing after the reboot")
	}
	ea := a.start()
	sent := s.sent.Load()
	if !eventually(20*time.Second, func() bool { return s.sent.Load() >= sent+300 }) {
		t.Fatal("the client sent nothing after espd started")
	}
	up := time.Now()
	k := newFCKeys(t, 1)
	keyAll(t, ea, k.a, fcPolicies(fcLANA, fcLANB))
	rekeyB(t, b, k)
	s.waitReceived(t, 200, 20*time.Second, "after the reboot")
	s.stop()
	fcCheck(t, c, down, up)
	f.c = nil
}
