package e2e

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// TestSuites keys an IPv4-in-IPv4 raw ESP tunnel with espctl for each suite
// and requires a ping and 20 MiB each way over TCP whose SHA-256 matches at
// the far end. No integrity failure may be counted on either side.
func TestSuites(t *testing.T) {
	for _, suite := range []string{"aes128gcm16", "aes256gcm16", "chacha20poly1305", "aes128-sha256", "aes256-sha1"} {
		t.Run(suite, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			tn := newTunnel(t, tunnelOpts{suite: suite, inner: []testbed.Family{testbed.IPv4}})
			ping(t, ctx, tn.top, testbed.IPv4, false)
			transfer(t, ctx, tn.top, testbed.IPv4, true, bigTransfer)
			transfer(t, ctx, tn.top, testbed.IPv4, false, bigTransfer)
			for _, c := range []struct {
				e   *espd
				spi uint32
				dst netip.Addr
			}{{tn.b, spiAB, tn.bOuter}, {tn.a, spiBA, tn.aOuter}} {
				in := c.e.saCounter(t, c.spi, c.dst, cntPackets...)
				bad := c.e.saCounter(t, c.spi, c.dst, cntIntegrity...)
				// 20 MiB at most 1400 bytes per packet is at least 14979 packets.
				if in < bigTransfer/1400 || bad != 0 {
					t.Errorf("%s inbound state 0x%x: %d packets, %d integrity failures", c.e.node.Role, c.spi, in, bad)
				}
			}
			for _, e := range []*espd{tn.a, tn.b} {
				for _, args := range [][]string{{"sa", "list"}, {"--json", "sa", "list"}, {"--json", "stats"}} {
					if k := tn.keyIn(e.mustCtl(t, args...)); k != "" {
						t.Errorf("espctl %v on %s shows key %s", args, e.node.Role, k)
					}
				}
			}
			logSocketDrops(t, ctx, tn)
			tn.a.alive(t)
			tn.b.alive(t)
		})
	}
}
