package system

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/espd/espd/bench/xfrm"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/sa"
	"github.com/espd/espd/testbed"
	"github.com/vishvananda/netlink"
)

// hostSystems are the host-to-host systems All() must have, with whether
// each is keyed per suite and carries ESP-in-UDP.
var hostSystems = map[string]struct{ perSuite, encap bool }{
	"hosts-plain":        {false, false},
	"espd-transport":     {true, false},
	"espd-transport-udp": {true, true},
	"xfrm-transport":     {true, false},
}

// fakeLine is a line whose nodes are named only, for what Endpoints
// returns without namespaces.
func fakeLine() *testbed.Topology {
	n := func(role string) *testbed.Node { return &testbed.Node{Name: "fake-" + role, Role: role} }
	return &testbed.Topology{Client: n("client"), GwA: n("gwA"), GwB: n("gwB"), Server: n("server")}
}

// TestHostToHostSystems: All() has the host-to-host systems after every
// gateway system; they, and only they, implement HostToHost, are in
// HostToHostGroup and say so in their labels; they run wherever espd
// does (xfrm-transport finds out per suite, as xfrm), and they are
// measured from gwA to gwB's transit address of the family, the others
// from the client to the server.
func TestHostToHostSystems(t *testing.T) {
	seen := map[string]bool{}
	lastGateway, firstHost := -1, -1
	for i, s := range All() {
		want, isHost := hostSystems[s.Name()]
		_, implements := s.(HostToHost)
		if implements != isHost {
			t.Errorf("%s: implements HostToHost %v, want %v", s.Name(), implements, isHost)
		}
		if isHost {
			seen[s.Name()] = true
			if firstHost < 0 {
				firstHost = i
			}
			if Group(s) != HostToHostGroup || !strings.HasPrefix(s.Label(), "host to host, transport mode: ") {
				t.Errorf("%s: group %q, label %q", s.Name(), Group(s), s.Label())
			}
			if s.PerSuite() != want.perSuite {
				t.Errorf("%s: PerSuite %v", s.Name(), s.PerSuite())
			}
			if e, ok := s.(*EspdTransport); ok && e.encap != want.encap {
				t.Errorf("%s: encap %v", s.Name(), e.encap)
			}
			if err := s.Available(&Env{EspdBin: "/x/espd"}); err != nil {
				t.Errorf("%s: Available: %v", s.Name(), err)
			}
			if _, ok := s.(Tunnels); ok {
				t.Errorf("%s implements Tunnels: the scale mode keys tunnels between sites", s.Name())
			}
		} else {
			lastGateway = i
			if Group(s) != "" || strings.Contains(s.Label(), "host to host") {
				t.Errorf("gateway system %s: group %q, label %q", s.Name(), Group(s), s.Label())
			}
		}
	}
	for name := range hostSystems {
		if !seen[name] {
			t.Errorf("All() lacks %s", name)
		}
	}
	if firstHost < lastGateway {
		t.Errorf("host-to-host systems from %d, gateway systems up to %d: want the gateways first", firstHost, lastGateway)
	}

	top := fakeLine()
	for _, f := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
		gwB := testbed.Pick(f, testbed.GwBTransitV4, testbed.GwBTransitV6).Addr()
		for _, s := range []HostToHost{&HostsPlain{}, NewEspdTransport("t", "t", true), &XFRMTransport{}} {
			// What Setup sets.
			switch s := s.(type) {
			case *HostsPlain:
				s.top, s.a = top, addrsOf(f)
			case *EspdTransport:
				s.top, s.a = top, addrsOf(f)
			case *XFRMTransport:
				s.top, s.a = top, addrsOf(f)
			}
			ep := EndpointsOf(s, f)
			if ep.From != top.GwA || ep.To != top.GwB || ep.Dst != gwB || s.Topology() != top {
				t.Errorf("%s %v: endpoints %s -> %s at %v, want gwA -> gwB at %v", s.Name(), f, ep.From.Role, ep.To.Role, ep.Dst, gwB)
			}
		}
		r := &Routing{top: top}
		srv := testbed.Pick(f, testbed.ServerV4, testbed.ServerV6).Addr()
		if ep := EndpointsOf(r, f); ep.From != top.Client || ep.To != top.Server || ep.Dst != srv {
			t.Errorf("routing %v: endpoints %s -> %s at %v, want client -> server at %v", f, ep.From.Role, ep.To.Role, ep.Dst, srv)
		}
	}
}

// TestEspdTransportKeys: espd-transport's states and policies are the
// espd system's tunnel in transport mode between the hosts: the same
// SPIs, reqid and keys, the hosts' addresses as endpoints and as the
// policies' single-address selectors.
func TestEspdTransportKeys(t *testing.T) {
	s, _ := crypto.ParseSuite("aes128gcm16")
	a, b := addrsOf(testbed.IPv4).gwA, addrsOf(testbed.IPv4).gwB
	out := espdState(s, sa.DirOut, SPIAB, a, b, true)
	enc, integ := SuiteKeys(s, SPIAB)
	if out.Src != a || out.Dst != b || out.ReqID != ReqID || !bytes.Equal(out.EncKey, enc) || !bytes.Equal(out.IntegKey, integ) ||
		out.EncapSrcPort != 4500 || out.EncapDstPort != 4500 || out.ReplayWindow != 0 || out.Mode != sa.ModeTunnel {
		t.Errorf("outbound state: %+v", out)
	}
	if in := espdState(s, sa.DirIn, SPIBA, b, a, false); in.ReplayWindow != EspdReplayWindow || in.EncapDstPort != 0 {
		t.Errorf("inbound state: %+v", in)
	}
	ps := transportPolicies(a, b)
	if len(ps) != 2 {
		t.Fatalf("%d policies", len(ps))
	}
	for i, want := range []struct {
		dir      sa.Direction
		src, dst string
	}{{sa.DirOut, "198.18.0.1/32", "198.18.0.2/32"}, {sa.DirIn, "198.18.0.2/32", "198.18.0.1/32"}} {
		p := ps[i]
		if p.Dir != want.dir || p.Src.String() != want.src || p.Dst.String() != want.dst || p.Mode != sa.ModeTransport ||
			p.Action != sa.ActionProtect || p.ReqID != ReqID {
			t.Errorf("policy %d: %+v", i, p)
		}
		if err := p.Validate(); err != nil {
			t.Errorf("policy %d: %v", i, err)
		}
	}
}

// TestXFRMTransportAssociations: xfrm-transport keys the kernel with the
// xfrm system's SPIs and keys, in transport mode between the hosts, each
// side's outbound keys the other's inbound ones.
func TestXFRMTransportAssociations(t *testing.T) {
	s, _ := crypto.ParseSuite("aes128-sha256")
	x := &XFRMTransport{}
	x.a = addrsOf(testbed.IPv6)
	ta, tb := x.associations(s)
	for _, tn := range []xfrm.Tunnel{ta, tb} {
		if !tn.Transport || tn.LocalNet != hostPrefix(tn.Local) || tn.RemoteNet != hostPrefix(tn.Remote) || tn.ReqID != ReqID {
			t.Errorf("association %+v", tn)
		}
	}
	if ta.Local != x.a.gwA || ta.Remote != x.a.gwB || tb.Local != x.a.gwB || ta.OutSPI != SPIAB || tb.InSPI != SPIAB ||
		!bytes.Equal(ta.OutEncKey, tb.InEncKey) || !bytes.Equal(tb.OutIntegKey, ta.InIntegKey) {
		t.Errorf("the two sides do not match: %+v %+v", ta, tb)
	}
	enc, _ := SuiteKeys(s, SPIAB)
	if !bytes.Equal(ta.OutEncKey, enc) {
		t.Error("gwA's outbound key is not SuiteKeys' for SPIAB")
	}
	states, err := ta.States()
	if err != nil || len(states) != 2 {
		t.Fatalf("states %v, %v", states, err)
	}
	if !slices.ContainsFunc(ta.Policies(), func(p *netlink.XfrmPolicy) bool { return p.Dst.String() == "2001:db8::2/128" }) {
		t.Errorf("gwA has no policy to gwB's address: %v", ta.Policies())
	}
}
