package e2e

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// BenchmarkPairFailover measures TestPairManual's pair at full load: one
// sender floods 1,000-byte UDP datagrams from the server to the client
// through the peer and the pair as fast as it goes; 3 s in, node1 dies
// (espd and keepalived killed, links cut) and node2 takes over. It
// reports the longest time without a datagram at the client (gap-ms: the
// failover as the traffic sees it, VRRP's detection included), the
// datagrams per second before the kill (pps), and the pair link's
// traffic both ways while node1 carried the flood (sync-B/s: reservations,
// windows, acknowledgements, hellos and the standby's own reports of one
// tunnel). Run with -benchtime 1x: each iteration builds the pair.
func BenchmarkPairFailover(b *testing.B) {
	for range b.N {
		mp := newManualPair(b)
		mp.released(b)
		p := mp.p

		var conn *net.UDPConn
		if err := p.Client.Do(func() error {
			var err error
			conn, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(testbed.ClientV4.Addr(), 0)))
			return err
		}); err != nil {
			b.Fatal(err)
		}
		var got atomic.Uint64
		var maxGap atomic.Int64
		done := make(chan struct{})
		go func() {
			defer close(done)
			buf := make([]byte, 2048)
			var last time.Time
			for {
				if _, err := conn.Read(buf); err != nil {
					if errors.Is(err, net.ErrClosed) {
						return
					}
					continue
				}
				now := time.Now()
				if !last.IsZero() && int64(now.Sub(last)) > maxGap.Load() {
					maxGap.Store(int64(now.Sub(last)))
				}
				last = now
				got.Add(1)
			}
		}()
		dst := conn.LocalAddr().(*net.UDPAddr).AddrPort()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		sent := make(chan struct{})
		go func() {
			defer close(sent)
			p.Server.SendUDP(ctx, dst, testbed.UDPSendOptions{Size: 1000, Count: 1 << 30})
		}()

		ctxRun := context.Background()
		syncBytes := func() uint64 {
			var sum uint64
			for _, n := range []*testbed.Node{p.Node1, p.Node2} {
				out, err := n.Run(ctxRun, "cat", "/sys/class/net/"+testbed.IfSync+"/statistics/tx_bytes")
				if err != nil {
					b.Fatal(err)
				}
				v, err := strconv.ParseUint(strings.TrimSpace(out), 10, 64)
				if err != nil {
					b.Fatal(err)
				}
				sum += v
			}
			return sum
		}
		if !eventually(10*time.Second, func() bool { return got.Load() > 0 }) {
			b.Fatal("no datagram reached the client")
		}
		start, sync0, got0 := time.Now(), syncBytes(), got.Load()
		if !eventually(10*time.Second, func() bool { return time.Since(start) > 3*time.Second }) {
			b.Fatal("unreachable")
		}
		elapsed, sync1, got1 := time.Since(start), syncBytes(), got.Load()
		maxGap.Store(0)
		mp.killNode1(b)
		mp.node2Holds(b)
		<-sent
		cancel()
		conn.Close()
		<-done

		b.ReportMetric(float64(maxGap.Load())/1e6, "gap-ms")
		b.ReportMetric(float64(got1-got0)/elapsed.Seconds(), "pps")
		b.ReportMetric(float64(sync1-sync0)/elapsed.Seconds(), "sync-B/s")
		b.Logf("gap %v; %d datagrams in %v before the kill; pair link %d bytes", time.Duration(maxGap.Load()), got1-got0, elapsed, sync1-sync0)
	}
}
