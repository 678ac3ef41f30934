package dataplane

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/espd/espd/packet"
)

// mtuRouter's PathMTU answers mtu and counts its calls.
type mtuRouter struct {
	mtu   atomic.Int32
	calls atomic.Uint64
}

func (r *mtuRouter) PathMTU(netip.Addr) (int, error) {
	r.calls.Add(1)
	return int(r.mtu.Load()), nil
}

// TestPathMTUOffPacketPath: the reader looks a peer's route up once; the
// refresh, not the packets, follows a route's MTU change; an idle peer is
// forgotten and looked up again when sent to.
func TestPathMTUOffPacketPath(t *testing.T) {
	r := &mtuRouter{}
	r.mtu.Store(1400)
	h := newHarnessPathMTU(t, Config{ICMPRate: 1000}, false, nil, nil, r.PathMTU)
	out, _ := h.add(tunnel{reqid: 1, spi: 0x100, dst: netip.MustParsePrefix("198.19.1.0/24")})
	dst := netip.MustParseAddr("198.19.1.1")

	const n = 200
	for i := range n / 10 {
		batch := make([][]byte, 10)
		for j := range batch {
			batch[j] = udpPacket(innerSrc4, dst, 1, 2, uint64(i*10+j), 100, true)
		}
		h.tun.in <- batch
	}
	waitFor(t, "the packets sent", func() bool { return len(h.tx.packets()) == n })
	if got := h.d.pmtu.readerLookups.Load(); got != 1 {
		t.Fatalf("%d route lookups on the packet path for %d packets to one peer, want 1", got, n)
	}

	// The route's MTU drops: the refresh learns it, the reader only reads.
	r.mtu.Store(1300)
	before := r.calls.Load()
	h.d.pmtu.refresh()
	if r.calls.Load() == before {
		t.Fatal("refresh looked nothing up")
	}
	inner := out.Encapsulator().InnerMTU(1300)
	h.tun.in <- [][]byte{udpPacket(innerSrc4, dst, 1, 2, n, inner+1, true)}
	waitFor(t, "an ICMP error", func() bool { return len(h.tun.packets()) == 1 })
	icmp := h.tun.packets()[0]
	ip, err := packet.ParseIPv4Header(icmp)
	if err != nil {
		t.Fatal(err)
	}
	if m := icmp[ip.HeaderLen:]; int(binary.BigEndian.Uint16(m[6:8])) != inner {
		t.Errorf("ICMP announces MTU %d, want %d (the refreshed route's)", binary.BigEndian.Uint16(m[6:8]), inner)
	}
	if got := h.d.pmtu.readerLookups.Load(); got != 1 {
		t.Errorf("%d route lookups on the packet path after the refresh, want still 1", got)
	}

	// Idle for pmtuIdleRounds refreshes: forgotten, then looked up anew.
	for range pmtuIdleRounds + 1 {
		h.d.pmtu.refresh()
	}
	h.d.pmtu.mu.Lock()
	peers := len(h.d.pmtu.peers)
	h.d.pmtu.mu.Unlock()
	if peers != 0 {
		t.Fatalf("%d peers known after %d idle refreshes, want 0", peers, pmtuIdleRounds+1)
	}
	sent := len(h.tx.packets())
	h.tun.in <- [][]byte{udpPacket(innerSrc4, dst, 1, 2, n+1, 100, true)}
	waitFor(t, "a packet to the forgotten peer", func() bool { return len(h.tx.packets()) == sent+1 })
	if got := h.d.pmtu.readerLookups.Load(); got != 2 {
		t.Errorf("%d route lookups on the packet path, want 2 (the forgotten peer's again)", got)
	}
}

// TestPathMTUGetAllocs: a known peer's MTU is read without allocating.
func TestPathMTUGetAllocs(t *testing.T) {
	var tab pathMTUs
	tab.init(0, new(mtuRouter).PathMTU)
	var c pmtuCache
	c.init(&tab)
	dst := netip.MustParseAddr("198.18.0.2")
	c.get(dst)
	if a := testing.AllocsPerRun(1000, func() { c.get(dst) }); a != 0 {
		t.Errorf("get allocates %.1f times", a)
	}
}

// TestPathMTUConcurrentRefresh runs readers against refreshes that forget
// and relearn peers, for the race detector.
func TestPathMTUConcurrentRefresh(t *testing.T) {
	r := &mtuRouter{}
	r.mtu.Store(1400)
	var tab pathMTUs
	tab.init(0, r.PathMTU)
	peers := make([]netip.Addr, 64)
	for i := range peers {
		peers[i] = netip.AddrFrom4([4]byte{198, 18, 1, byte(i)})
	}
	stop, refresherDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(refresherDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			r.mtu.Store(int32(1300 + i%100))
			tab.refresh()
		}
	}()
	var readers sync.WaitGroup
	for k := range 2 {
		readers.Add(1)
		go func() {
			defer readers.Done()
			var c pmtuCache
			c.init(&tab)
			for i := range 20000 {
				// Half of the time only half of the peers are sent to, so
				// that the others go idle and are forgotten.
				p := peers[(i*7+k)%len(peers)]
				if i%1000 < 500 {
					p = peers[(i*7+k)%(len(peers)/2)]
				}
				if m := c.get(p); m < 1300 || m > 1400 {
					t.Errorf("MTU %d, want 1300..1400", m)
					return
				}
			}
		}()
	}
	readers.Wait()
	close(stop)
	<-refresherDone
}

// BenchmarkPathMTU10kPeers reads the path MTU of 10,000 peers in turn while
// a refresh runs beside each pass over them (the refresher's work of every
// pmtuRefresh, here once per pass). It reports the lookups the reader made
// (none: each peer was learnt before the timer) and the slowest pass
// against the mean one: a refresh landing on the reader would show there.
func BenchmarkPathMTU10kPeers(b *testing.B) {
	const npeers = 10000
	r := &mtuRouter{}
	r.mtu.Store(1400)
	var tab pathMTUs
	tab.init(0, r.PathMTU)
	var c pmtuCache
	c.init(&tab)
	peers := make([]netip.Addr, npeers)
	for i := range peers {
		peers[i] = netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
		c.get(peers[i])
	}
	warm := tab.readerLookups.Load()
	pass, done := make(chan struct{}, 1), make(chan struct{})
	var refreshes int
	go func() {
		defer close(done)
		for range pass {
			tab.refresh()
			refreshes++
		}
	}()
	var maxPass, total time.Duration
	passes := 0
	b.ResetTimer()
	for i := 0; i < b.N; {
		start := time.Now()
		for j := 0; j < npeers && i < b.N; j, i = j+1, i+1 {
			c.get(peers[j])
		}
		d := time.Since(start)
		total += d
		maxPass = max(maxPass, d)
		passes++
		select {
		case pass <- struct{}{}:
		default: // the last refresh still runs
		}
	}
	b.StopTimer()
	close(pass)
	<-done
	b.ReportMetric(float64(tab.readerLookups.Load()-warm), "reader-lookups")
	b.ReportMetric(float64(refreshes), "refreshes")
	if passes > 1 {
		b.ReportMetric(float64(maxPass)/(float64(total)/float64(passes)), "max/mean-pass")
	}
}
