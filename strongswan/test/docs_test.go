package strongswantest

import (
	"context"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/internal/docblock"
	"github.com/espd/espd/testbed"
)

// docPath is the page whose examples the tests here run.
const docPath = "../../docs/strongswan.md"

// docExample returns the text of the one fenced block of
// docs/strongswan.md whose info string is lang and marker
// (internal/docblock), as written.
func docExample(t *testing.T, lang, marker string) string {
	t.Helper()
	text, err := docblock.One(docPath, lang, marker)
	if err != nil {
		t.Fatal(err)
	}
	return text
}

// docSecret runs docs/strongswan.md's sh block marked marker, which makes
// an example's secrets file with a fresh pre-shared key, as written
// (testbed.RunSecretBlock), and returns the file and the key.
func docSecret(t *testing.T, marker string) (secrets, key string) {
	t.Helper()
	return testbed.RunSecretBlock(t, docExample(t, "sh", marker))
}

// withPSK returns a peer's configuration with key for its @PSK@.
func withPSK(conf, key string) string {
	return strings.Replace(conf, "@PSK@", key, 1)
}

// The addresses of the docs' IPv6 site-to-site example ("pulse"): the
// Celeron box is gateway A, the pulse gateway B.
var (
	pulseA = netip.MustParsePrefix("2001:db8:ff00:16b::1/64") // A's local_addrs
	pulseB = netip.MustParsePrefix("2001:db8:ff00::1/64")     // A's remote_addrs
	// Hosts inside the example's traffic selectors: the client behind A
	// (local_ts 2001:db8:100::/40, 198.18.10.10/32), the server behind B
	// (remote_ts 2001:db8:ff00::/40, 198.18.64.0/20).
	pulseClientV4 = netip.MustParseAddr("198.18.10.10")
	pulseClientV6 = netip.MustParsePrefix("2001:db8:100::2/64")
	pulseGwALANV6 = netip.MustParsePrefix("2001:db8:100::1/64")
	pulseServerV4 = netip.MustParsePrefix("198.18.64.2/20")
	pulseGwBLANV4 = netip.MustParsePrefix("198.18.64.1/20")
	pulseServerV6 = netip.MustParsePrefix("2001:db8:ff01::2/64")
	pulseGwBLANV6 = netip.MustParsePrefix("2001:db8:ff01::1/64")
)

// pulsePeer is gateway B's side of the docs' example: its mirror image,
// with the key the example's secret block made for @PSK@ (withPSK).
const pulsePeer = `connections {
    pulse {
        version = 2
        local_addrs = 2001:db8:ff00::1
        remote_addrs = 2001:db8:ff00:16b::1
        proposals = aes128gcm16-prfsha512-ecp521,chacha20poly1305-prfsha256-x25519
        fragmentation = yes
        dpd_delay = 600s
        local {
            auth = psk
            id = @pulse.example.com
        }
        remote {
            auth = psk
            id = @intel.example.com
        }
        children {
            pulse {
                local_ts = 2001:db8:ff00::/40,198.18.64.0/20,198.19.144.0/20
                remote_ts = 2001:db8:100::/40,198.18.10.10/32,2001:db8:ff00:16b::/64
                esp_proposals = chacha20poly1305-x25519,chacha20poly1305
            }
        }
    }
}
secrets {
    ike-pulse {
        id-1 = @intel.example.com
        id-2 = @pulse.example.com
        secret = @PSK@
    }
}
`

// pulseAddresses gives the testbed the example's addresses: the IKE
// addresses on the transit link, and hosts inside the traffic selectors
// behind each gateway, with routes that make the client use them.
func pulseAddresses(t *testing.T, topo *testbed.Topology) {
	t.Helper()
	for _, c := range []struct {
		n    *testbed.Node
		args []string
	}{
		{topo.GwA, []string{"-6", "addr", "add", pulseA.String(), "dev", testbed.IfTransit, "nodad"}},
		{topo.GwB, []string{"-6", "addr", "add", pulseB.String(), "dev", testbed.IfTransit, "nodad"}},
		{topo.GwA, []string{"-6", "route", "add", pulseB.Masked().String(), "dev", testbed.IfTransit}},
		{topo.GwB, []string{"-6", "route", "add", pulseA.Masked().String(), "dev", testbed.IfTransit}},

		{topo.Client, []string{"-4", "addr", "add", pulseClientV4.String() + "/32", "dev", testbed.IfHost}},
		{topo.Client, []string{"-6", "addr", "add", pulseClientV6.String(), "dev", testbed.IfHost, "nodad"}},
		{topo.GwA, []string{"-4", "route", "add", pulseClientV4.String() + "/32", "dev", testbed.IfLAN}},
		{topo.GwA, []string{"-6", "addr", "add", pulseGwALANV6.String(), "dev", testbed.IfLAN, "nodad"}},
		{topo.Client, []string{"-4", "route", "add", pulseServerV4.Masked().String(), "via",
			testbed.GwALANV4.Addr().String(), "src", pulseClientV4.String()}},
		{topo.Client, []string{"-6", "route", "add", "2001:db8:ff00::/40", "via",
			pulseGwALANV6.Addr().String(), "src", pulseClientV6.Addr().String()}},

		{topo.Server, []string{"-4", "addr", "add", pulseServerV4.String(), "dev", testbed.IfHost}},
		{topo.Server, []string{"-6", "addr", "add", pulseServerV6.String(), "dev", testbed.IfHost, "nodad"}},
		{topo.GwB, []string{"-4", "addr", "add", pulseGwBLANV4.String(), "dev", testbed.IfLAN}},
		{topo.GwB, []string{"-6", "addr", "add", pulseGwBLANV6.String(), "dev", testbed.IfLAN, "nodad"}},
	} {
		c.n.MustIP(t, c.args...)
	}
}

var (
	ikeHostRE = regexp.MustCompile(`local-host=(\S+) local-port=\d+ .*remote-host=(\S+) remote-port=`)
	espdSARE  = regexp.MustCompile(`(?m)^spi 0x[0-9a-f]{8} dir (?:in|out) state [a-z]+ reqid \d+\n\tsrc (\S+) dst (\S+) proto esp`)
)

// checkPulseEndpoints checks that g's IKE_SA and its states in espd run
// between the example's IPv6 addresses, local first.
func checkPulseEndpoints(t *testing.T, g *gateway, local, remote netip.Addr, when string) {
	t.Helper()
	sas := g.mustSwanctl("--list-sas", "--raw")
	m := ikeHostRE.FindAllStringSubmatch(sas, -1)
	if len(m) != 1 || m[0][1] != local.String() || m[0][2] != remote.String() {
		t.Errorf("%s, %s: IKE_SA endpoints %v, want one IKE_SA %v - %v:\n%s", when, g.name, m, local, remote, sas)
	}
	states := g.mustEspctl("sa", "list")
	outer := espdSARE.FindAllStringSubmatch(states, -1)
	if len(outer) < 2 {
		t.Errorf("%s, %s: espd has %d states, want an inbound and an outbound one:\n%s", when, g.name, len(outer), states)
	}
	for _, o := range outer {
		if (o[1] != local.String() || o[2] != remote.String()) && (o[1] != remote.String() || o[2] != local.String()) {
			t.Errorf("%s, %s: espd's state runs %s -> %s, not between %v and %v:\n%s", when, g.name, o[1], o[2], local, remote, states)
		}
	}
}

// TestDocsIPv6SiteToSite runs the docs' IPv6 site-to-site example (the
// Celeron "pulse" setup) as written on gateway A, its mirror image on B,
// with MOBIKE on (swanctl's default) and Debian's own retransmit timers.
// Its remote subnet 2001:db8:ff00::/40 covers the peer's IKE address (and
// A's own), and B's covers A's: once espd routes them into its TUN, charon's
// own route lookups must still find the transit link (the plugin makes
// kernel-netlink mark them with espd's mark), or charon logs "no address
// found to reach" and MOBIKE moves the IKE_SA to IPv4 as soon as something
// makes it re-check the path (here an address coming and going on each
// LAN link, and A's espd restarting: its TUN goes, its held prefixes stay
// as blackholes). After the tunnel is up, after that and traffic of both
// families, and after the restart, both gateways' IKE_SAs and
// espd's states must still run between the IPv6 addresses, and neither
// charon may have logged a failed route lookup for its peer.
func TestDocsIPv6SiteToSite(t *testing.T) {
	requireStrongSwan(t)
	conf := docExample(t, "conf", "site-to-site ipv6")
	if !strings.Contains(conf, "remote_addrs = "+pulseB.Addr().String()) ||
		!strings.Contains(conf, "2001:db8:ff00::/40") {
		t.Fatalf("the docs' IPv6 example changed; update the test's addresses:\n%s", conf)
	}
	p := newPair(t, pairOptions{A: charonOptions{DebianTimers: true}, B: charonOptions{DebianTimers: true}})
	pulseAddresses(t, p.topo)
	secrets, key := docSecret(t, "site-to-site ipv6 secret")
	p.b.load(withPSK(pulsePeer, key))
	p.a.load(conf + secrets) // start_action = start: A initiates
	p.a.waitChild("pulse", 20*time.Second)
	p.b.waitChild("pulse", 10*time.Second)
	checkPulseEndpoints(t, p.a, pulseA.Addr(), pulseB.Addr(), "tunnel up")
	checkPulseEndpoints(t, p.b, pulseB.Addr(), pulseA.Addr(), "tunnel up")
	routes := p.a.tunnelRoutes()
	if !strings.Contains(routes, "2001:db8:ff00::/40") {
		t.Fatalf("A: espd does not route the remote subnet that covers B's IKE address into its TUN: %q", routes)
	}

	// An address coming and going on each LAN link (as a DHCP lease or a
	// SLAAC prefix would) makes charon re-check the IKE path: a route
	// lookup for the peer.
	for i, g := range []*gateway{p.a, p.b} {
		addr := []string{"2001:db8:100::99/128", "2001:db8:ff01::99/128"}[i]
		g.node.MustIP(t, "-6", "addr", "add", addr, "dev", testbed.IfLAN, "nodad")
		time.Sleep(500 * time.Millisecond)
		g.node.MustIP(t, "-6", "addr", "del", addr, "dev", testbed.IfLAN)
	}

	// Some seconds of traffic of both families through the tunnel.
	ctx := context.Background()
	for _, dst := range []netip.Addr{pulseServerV4.Addr(), pulseServerV6.Addr()} {
		r, err := p.topo.Client.Ping(ctx, dst, testbed.PingOptions{Count: 15, Interval: 200 * time.Millisecond})
		if err != nil || !r.OK() {
			t.Fatalf("pings client -> %v through the tunnel: %v\n%s", dst, err, r.Output)
		}
	}
	for _, dst := range []netip.Addr{pulseServerV4.Addr(), pulseServerV6.Addr()} {
		res, err := testbed.Transfer(ctx, testbed.TransferOptions{
			From: p.topo.Client, To: p.topo.Server, Dst: dst, Bytes: 4 << 20, Timeout: 60 * time.Second, Seed: 3,
		})
		if err != nil {
			t.Fatalf("transfer to %v: %v (%v)", dst, err, res)
		}
	}
	time.Sleep(2 * time.Second) // charon's roam events settle (100 ms each)
	checkPulseEndpoints(t, p.a, pulseA.Addr(), pulseB.Addr(), "after traffic")
	checkPulseEndpoints(t, p.b, pulseB.Addr(), pulseA.Addr(), "after traffic")

	// espd on A goes away for 3 s: its TUN goes, the held prefixes are
	// blackholes in espd's table, and charon re-checks its IKE path. Its
	// lookup must find the transit link, not the blackhole.
	before, _ := p.a.installedChild("pulse")
	p.a.killEspd()
	time.Sleep(3 * time.Second)
	p.a.runEspd()
	if !waitFor(20*time.Second, func() bool {
		c, ok := p.a.installedChild("pulse")
		return ok && c.SPIOut != before.SPIOut
	}) {
		t.Fatalf("A: the CHILD_SA was not replaced after espd's restart:\n%s", p.a.mustSwanctl("--list-sas"))
	}
	for _, dst := range []netip.Addr{pulseServerV4.Addr(), pulseServerV6.Addr()} {
		if !waitFor(10*time.Second, func() bool {
			r, err := p.topo.Client.Ping(ctx, dst, testbed.PingOptions{Count: 1, Wait: 300 * time.Millisecond})
			return err == nil && r.OK()
		}) {
			t.Fatalf("no ping client -> %v through the tunnel after espd's restart", dst)
		}
	}
	time.Sleep(2 * time.Second)
	checkPulseEndpoints(t, p.a, pulseA.Addr(), pulseB.Addr(), "after espd's restart")
	checkPulseEndpoints(t, p.b, pulseB.Addr(), pulseA.Addr(), "after espd's restart")
	for _, g := range []*gateway{p.a, p.b} {
		for _, bad := range []string{"no address found to reach", "no route found to reach", "requesting address change using MOBIKE"} {
			if n := g.charonLogCount(bad); n > 0 {
				t.Errorf("%s: charon logged %q %d times", g.name, bad, n)
			}
		}
		if g.charonLogCount("espd: charon's route lookups skip espd's routes") == 0 {
			t.Errorf("%s: the plugin did not say that charon's route lookups skip espd's routes", g.name)
		}
	}
}

// ix2207Peer is gateway B's side of the docs' IPv4 example (withPSK).
const ix2207Peer = `connections {
    ix2207 {
        version = 2
        local_addrs = 198.18.0.2
        remote_addrs = 198.18.0.1
        proposals = aes128-sha256-modp2048
        local {
            auth = psk
            id = ix2207.example.com
        }
        remote {
            auth = psk
            id = debian.example.com
        }
        children {
            lan {
                local_ts = 198.18.2.0/24
                remote_ts = 198.18.1.0/24
                esp_proposals = aes128gcm16
            }
        }
    }
}
secrets {
    ike-ix2207 {
        id-1 = debian.example.com
        id-2 = ix2207.example.com
        secret = @PSK@
    }
}
`

// TestDocsIPv4SiteToSite runs the docs' IPv4 site-to-site example (the
// IX2207 setup) as written on gateway A, whose addresses and LAN it uses,
// against its mirror image on B, and sends traffic through it.
func TestDocsIPv4SiteToSite(t *testing.T) {
	requireStrongSwan(t)
	conf := docExample(t, "conf", "site-to-site psk ipv4")
	for _, want := range []string{"local_addrs = " + testbed.GwATransitV4.Addr().String(),
		"remote_addrs = " + testbed.GwBTransitV4.Addr().String(),
		"local_ts = " + testbed.LANAV4.String(), "remote_ts = " + testbed.LANBV4.String()} {
		if !strings.Contains(conf, want) {
			t.Fatalf("the docs' IPv4 example lacks %q; update the test:\n%s", want, conf)
		}
	}
	p := newPair(t, pairOptions{A: charonOptions{DebianTimers: true}, B: charonOptions{DebianTimers: true}})
	secrets, key := docSecret(t, "site-to-site psk ipv4 secret")
	p.b.load(withPSK(ix2207Peer, key))
	p.a.load(conf + secrets) // start_action = start: A initiates
	p.a.waitChild("lan", 20*time.Second)
	p.b.waitChild("lan", 10*time.Second)
	if out := p.a.mustEspctl("sa", "list"); strings.Count(out, "alg aes128gcm16 ") != 2 {
		t.Fatalf("A: espd's states do not use aes128gcm16:\n%s", out)
	}
	transfer(t, p.topo.Client, p.topo.Server, testbed.IPv4, 4<<20, 0)
	if n := p.a.charonLogCount("no address found to reach"); n > 0 {
		t.Errorf("A: charon logged \"no address found to reach\" %d times", n)
	}
}
