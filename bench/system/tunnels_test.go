package system

import (
	"strings"
	"testing"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/testbed"
)

// TestTunnelBlocks checks that each tunnel's blocks hold its hosts and the
// gateways' addresses, and no other tunnel's.
func TestTunnelBlocks(t *testing.T) {
	for _, f := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		for i := range MaxTunnels {
			c, s := TunnelAddrs(f, i)
			ga, gb := tunnelGateways(f, i)
			bc, bs := tunnelBlock(c), tunnelBlock(s)
			if !bc.Contains(ga) || !bs.Contains(gb) || ga == c || gb == s || bc.Bits() != c.BitLen()-2 {
				t.Fatalf("%v tunnel %d: blocks %v %v, hosts %v %v, gateways %v %v", f, i, bc, bs, c, s, ga, gb)
			}
			if i > 0 {
				pc, ps := TunnelAddrs(f, i-1)
				if bc.Contains(pc) || bs.Contains(ps) {
					t.Fatalf("%v: tunnel %d's blocks hold tunnel %d's hosts", f, i, i-1)
				}
			}
		}
	}
}

// TestCharonTunnelsConf checks the swanctl configuration of many children
// from both sides.
func TestCharonTunnelsConf(t *testing.T) {
	s, err := crypto.ParseSuite("aes128gcm16")
	if err != nil {
		t.Fatal(err)
	}
	a := charonTunnelsConf(testbed.IPv4, false, 3, "198.18.0.1", "198.18.0.2", "gwa", "gwb", s)
	b := charonTunnelsConf(testbed.IPv4, true, 3, "198.18.0.2", "198.18.0.1", "gwb", "gwa", s)
	for _, want := range []string{"bench0 {", "bench2 {", "local_ts = 198.19.16.8/30", "remote_ts = 198.19.32.8/30", "esp_proposals = aes128gcm16", "local_addrs = 198.18.0.1"} {
		if !strings.Contains(a, want) {
			t.Errorf("gwA's configuration lacks %q:\n%s", want, a)
		}
	}
	if strings.Contains(a, "bench3 {") || !strings.Contains(b, "local_ts = 198.19.32.8/30") || !strings.Contains(b, "remote_ts = 198.19.16.8/30") {
		t.Errorf("children wrong:\n%s\n%s", a, b)
	}
}

func TestCheckTunnels(t *testing.T) {
	for _, n := range []int{0, -1, MaxTunnels + 1} {
		if err := checkTunnels(n); !IsUnavailable(err) {
			t.Errorf("checkTunnels(%d) = %v", n, err)
		}
	}
	if err := checkTunnels(256); err != nil {
		t.Error(err)
	}
}
