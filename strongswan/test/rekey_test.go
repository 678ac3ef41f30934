package strongswantest

import (
	"context"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// udpProbe sends numbered-by-count UDP datagrams from the client to the
// server while a test runs, to count what a rekey loses.
type udpProbe struct {
	recv *testbed.UDPReceiver
	sent int
	err  error
	done chan struct{}
}

// startProbe sends count datagrams, one every interval.
func startProbe(t *testing.T, p *pair, count int, interval time.Duration) *udpProbe {
	t.Helper()
	dst := netip.AddrPortFrom(testbed.ServerV4.Addr(), 5001)
	r, err := p.topo.Server.ListenUDP(dst)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	pr := &udpProbe{recv: r, done: make(chan struct{})}
	go func() {
		defer close(pr.done)
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(count)*interval+30*time.Second)
		defer cancel()
		pr.sent, pr.err = p.topo.Client.SendUDP(ctx, dst, testbed.UDPSendOptions{Count: count, Interval: interval, Size: 200})
	}()
	return pr
}

// finish waits for the sender and a moment for stragglers, and returns
// sent and lost datagrams.
func (pr *udpProbe) finish(t *testing.T) (sent, lost int) {
	t.Helper()
	<-pr.done
	if pr.err != nil {
		t.Logf("UDP probe sender: %v", pr.err)
	}
	time.Sleep(300 * time.Millisecond)
	got := int(pr.recv.Packets())
	return pr.sent, pr.sent - got
}

// espdGlobal returns one of espd's global drop counters as espctl stats
// prints it ("invalid-spi 3").
func espdGlobal(g *gateway, name string) string {
	out, err := g.espctl("stats")
	if err != nil {
		return "?"
	}
	m := regexp.MustCompile(regexp.QuoteMeta(name) + ` (\d+)`).FindStringSubmatch(out)
	if m == nil {
		return "?"
	}
	return m[1]
}

// outSPIs collects the outbound SPIs espd has, over time.
type spiSet struct {
	mu  sync.Mutex
	set map[string]bool
}

func (s *spiSet) add(spis []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, x := range spis {
		s.set[x] = true
	}
}

func (s *spiSet) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.set)
}

// watchSPIs samples espd's outbound SPIs every 200 ms until stop closes.
func watchSPIs(g *gateway, stop <-chan struct{}) *spiSet {
	s := &spiSet{set: map[string]bool{}}
	go func() {
		for {
			if out, err := g.espctl("sa", "list"); err == nil {
				var spis []string
				for _, m := range regexp.MustCompile(`(?m)^spi 0x([0-9a-f]{8}) dir out `).FindAllStringSubmatch(out, -1) {
					spis = append(spis, m[1])
				}
				s.add(spis)
			}
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return s
}

// TestRekeyUnderLoad rekeys the CHILD_SA every few seconds, from both
// ends (espd's add-time soft expiry drives charon), while a paced TCP
// transfer and a UDP probe run; the transfer completes intact and the
// probe's losses are reported.
func TestRekeyUnderLoad(t *testing.T) {
	requireStrongSwan(t)
	p := newPair(t, pairOptions{})
	a, b := v4("aes128gcm16")
	a.Child = "        rekey_time = 4s\n        rand_time = 1s\n        life_time = 60s"
	b.Child = "        rekey_time = 5s\n        rand_time = 1s\n        life_time = 60s"
	p.load(a, b)
	p.initiate()

	stop := make(chan struct{})
	spisA := watchSPIs(p.a, stop)
	spisB := watchSPIs(p.b, stop)
	probe := startProbe(t, p, 1800, 10*time.Millisecond)
	// 22 MB at 1.1 MB/s: about 20 s of traffic, several rekeys.
	res := transfer(t, p.topo.Client, p.topo.Server, testbed.IPv4, 22<<20, 1100<<10)
	sent, lost := probe.finish(t)
	close(stop)

	rekeysA := p.a.charonLogCount("creating rekey job for CHILD_SA")
	rekeysB := p.b.charonLogCount("creating rekey job for CHILD_SA")
	doneA := p.a.charonLogCount("CHILD_SA net{", "established")
	doneB := p.b.charonLogCount("CHILD_SA net{", "established")
	t.Logf("rekey jobs from espd's soft expiries: A %d, B %d; CHILD_SAs established: A %d, B %d",
		rekeysA, rekeysB, doneA, doneB)
	t.Logf("outbound SAs seen in espd: A %d, B %d", spisA.len(), spisB.len())
	t.Logf("lost during rekeys: %d of %d UDP datagrams (%.2f%%); TCP retransmits %d; espd A invalid SPI %s, no state %s; B invalid SPI %s, no state %s",
		lost, sent, 100*float64(lost)/float64(max(sent, 1)), res.Retransmits,
		espdGlobal(p.a, "invalid-spi"), espdGlobal(p.a, "no-state"), espdGlobal(p.b, "invalid-spi"), espdGlobal(p.b, "no-state"))

	if rekeysA < 2 || rekeysB < 2 {
		t.Errorf("want rekeys from both ends (at least 2 each), got A %d, B %d", rekeysA, rekeysB)
	}
	if spisA.len() < 4 || spisB.len() < 4 {
		t.Errorf("want at least 4 outbound SAs over the run on each side, got A %d, B %d", spisA.len(), spisB.len())
	}
	if sent < 1800 {
		t.Errorf("UDP probe sent only %d of 1800 datagrams", sent)
	}
	// A rekey replaces SAs make-before-break: losses stay rare.
	if lost*20 > sent {
		t.Errorf("lost %d of %d datagrams during rekeys (more than 5%%)", lost, sent)
	}
	// The old outbound SA goes as soon as a rekey completes (its inbound
	// twin lingers for charon's delete_rekeyed_delay): one outbound state.
	if !waitFor(10*time.Second, func() bool { return len(p.a.espdSPIs()["out"]) == 1 }) {
		t.Errorf("A: espd keeps old outbound states: %v", p.a.espdSPIs())
	}
	if c, ok := p.a.installedChild("net"); !ok || !strings.Contains(strings.Join(p.a.espdSPIs()["out"], " "), c.SPIOut) {
		t.Errorf("A: charon's outbound SA %q is not espd's %v", c.SPIOut, p.a.espdSPIs())
	}
	// Nothing leaks: after the terminate neither espd keeps anything.
	p.a.mustSwanctl("--terminate", "--ike", "s2s", "--timeout", "10")
	checkEmpty(t, p.a)
	checkEmpty(t, p.b)
}

// TestLifetimes: small byte and packet limits make espd's soft expiry
// drive the rekeys; a hard limit without a rekey limit deletes the
// CHILD_SA (charon then re-creates it with fresh keys).
func TestLifetimes(t *testing.T) {
	requireStrongSwan(t)
	p := newPair(t, pairOptions{})
	a, b := v4("chacha20poly1305")
	// Soft at 4 MB or 4000 packets (whichever first), hard far beyond.
	// rand_* must stay below rekey_*: charon subtracts a random share of
	// it from the soft limit, and its default (life - rekey) wraps around.
	a.Child = "        rekey_time = 0\n        life_time = 0\n        rekey_bytes = 4000000\n        life_bytes = 400000000\n        rand_bytes = 100000\n" +
		"        rekey_packets = 4000\n        life_packets = 4000000\n        rand_packets = 100"
	p.load(a, b)
	p.initiate()
	first, _ := p.a.installedChild("net")
	// Paced (8 MB/s, 2 s), so that each rekey completes before the next
	// limit is reached.
	transfer(t, p.topo.Client, p.topo.Server, testbed.IPv4, 16<<20, 8<<20)
	if !waitFor(10*time.Second, func() bool { return p.a.charonLogCount("creating rekey job for CHILD_SA") >= 3 }) {
		t.Fatalf("A: want at least 3 rekeys driven by espd's byte/packet soft limits, got %d",
			p.a.charonLogCount("creating rekey job for CHILD_SA"))
	}
	if !strings.Contains(p.a.espd.Log(), "soft") {
		t.Errorf("A: espd logged no soft expire")
	}
	p.a.waitChild("net", 10*time.Second)
	if c, _ := p.a.installedChild("net"); c.SPIOut == first.SPIOut {
		t.Errorf("A: outbound SA %s survived its soft limit", c.SPIOut)
	}
	p.a.mustSwanctl("--terminate", "--ike", "s2s", "--timeout", "10")
	checkEmpty(t, p.a)

	// Hard limit only: 300 packets, then espd removes the states and
	// charon deletes and re-creates the CHILD_SA.
	a.Child = "        rekey_time = 0\n        life_time = 0\n        rekey_packets = 0\n        life_packets = 300\n        rand_packets = 0"
	p.load(a, b)
	p.initiate()
	before, _ := p.a.installedChild("net")
	ctx := context.Background()
	p.topo.Client.Ping(ctx, testbed.ServerV4.Addr(), testbed.PingOptions{Count: 400, Interval: 2 * time.Millisecond, Wait: time.Second})
	if !waitFor(10*time.Second, func() bool { return p.a.charonLogCount("creating delete job for CHILD_SA") >= 1 }) {
		t.Fatalf("A: no hard expire reached charon")
	}
	if p.a.charonLogCount("CHILD_SA recreate after hard expire") == 0 && p.b.charonLogCount("CHILD_SA recreate after hard expire") == 0 {
		t.Errorf("no CHILD_SA re-creation after the hard expire")
	}
	after := p.a.waitChild("net", 15*time.Second)
	if after.SPIOut == before.SPIOut || after.SPIIn == before.SPIIn {
		t.Fatalf("A: CHILD_SA not replaced after its hard expire: before %+v after %+v", before, after)
	}
	for _, spi := range append(p.a.espdSPIs()["out"], p.a.espdSPIs()["in"]...) {
		if spi == before.SPIOut || spi == before.SPIIn {
			t.Errorf("A: hard-expired SA %s still in espd", spi)
		}
	}
	res, err := p.topo.Client.Ping(ctx, testbed.ServerV4.Addr(), testbed.PingOptions{Count: 3})
	if err != nil || !res.OK() {
		t.Fatalf("no traffic through the re-created CHILD_SA: %v\n%s", err, res.Output)
	}
}
