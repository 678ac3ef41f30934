package strongswantest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/espd/espd/testbed"
)

// psk is the pre-shared key of every test connection.
const psk = "0sc2VjcmV0IGtleSBvZiB0aGUgZXNwZCB0ZXN0cw=="

// connection is one side of the test connection "s2s" with its CHILD_SA
// "net", as swanctl.conf.
type connection struct {
	Local, Remote     string // IKE addresses; Remote may be %any
	LocalID, RemoteID string // default: the addresses
	LocalTS, RemoteTS string // comma-separated
	ESP               string // esp_proposals
	StartAction       string // none (default), trap, start
	Child             string // more lines in the CHILD_SA section
	IKE               string // more lines in the connection section
}

func (c connection) String() string {
	lid, rid := c.LocalID, c.RemoteID
	if lid == "" {
		lid = c.Local
	}
	if rid == "" {
		rid = c.Remote
	}
	sa := c.StartAction
	if sa == "" {
		sa = "none"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "connections {\n  s2s {\n    version = 2\n")
	fmt.Fprintf(&b, "    local_addrs = %s\n    remote_addrs = %s\n", c.Local, c.Remote)
	fmt.Fprintf(&b, "    proposals = aes128-sha256-x25519\n    dpd_delay = 0\n")
	fmt.Fprintf(&b, "%s\n", c.IKE)
	fmt.Fprintf(&b, "    local {\n      auth = psk\n      id = %s\n    }\n", lid)
	fmt.Fprintf(&b, "    remote {\n      auth = psk\n      id = %s\n    }\n", rid)
	fmt.Fprintf(&b, "    children {\n      net {\n")
	fmt.Fprintf(&b, "        local_ts = %s\n        remote_ts = %s\n", c.LocalTS, c.RemoteTS)
	fmt.Fprintf(&b, "        esp_proposals = %s\n        start_action = %s\n", c.ESP, sa)
	fmt.Fprintf(&b, "%s\n      }\n    }\n  }\n}\n", c.Child)
	fmt.Fprintf(&b, "secrets {\n  ike-s2s {\n    id-a = %s\n    id-b = %s\n    secret = %s\n  }\n}\n", lid, rid, psk)
	return b.String()
}

// pair is gateway A (initiator, on testbed's gwA) and gateway B (on gwB)
// between the client's and the server's LANs.
type pair struct {
	topo *testbed.Topology
	a, b *gateway
}

// pairOptions shape newPair.
type pairOptions struct {
	// A and B configure the charons.
	A, B charonOptions
	// EspdA and EspdB are extra espd flags.
	EspdA, EspdB []string
}

// newPair builds the topology and starts espd (unless B runs
// kernel-libipsec) and charon on both gateways.
func newPair(t *testing.T, o pairOptions) *pair {
	t.Helper()
	topo := testbed.NewT(t, testbed.Options{Prefix: "sst"})
	p := &pair{topo: topo, a: newGateway(t, topo.GwA, "A"), b: newGateway(t, topo.GwB, "B")}
	p.a.noHandoff, p.b.noHandoff = o.A.NoHandoff, o.B.NoHandoff
	p.a.startEspd(o.EspdA...)
	if !o.B.Libipsec {
		p.b.startEspd(o.EspdB...)
	}
	p.a.startCharon(o.A)
	p.b.startCharon(o.B)
	return p
}

// v4 returns the IPv4 site-to-site connections of A and B.
func v4(esp string) (a, b connection) {
	a = connection{
		Local: testbed.GwATransitV4.Addr().String(), Remote: testbed.GwBTransitV4.Addr().String(),
		LocalTS: testbed.LANAV4.String(), RemoteTS: testbed.LANBV4.String(), ESP: esp,
	}
	b = connection{
		Local: a.Remote, Remote: a.Local, LocalTS: a.RemoteTS, RemoteTS: a.LocalTS, ESP: esp,
	}
	return a, b
}

// load gives both gateways their connection.
func (p *pair) load(a, b connection) {
	p.a.t.Helper()
	p.a.load(a.String())
	p.b.load(b.String())
}

// initiate brings the CHILD_SA up from A.
func (p *pair) initiate() {
	p.a.t.Helper()
	p.a.mustSwanctl("--initiate", "--child", "net", "--timeout", "20")
	p.a.waitChild("net", 10*testSecond)
	p.b.waitChild("net", 10*testSecond)
}
