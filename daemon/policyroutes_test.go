package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/espd/espd/routing"
	"github.com/espd/espd/sa"
)

// fakeRouteTable records route references.
type fakeRouteTable struct{ refs map[string]int }

func (r *fakeRouteTable) AddRoute(src, dst netip.Prefix, k routing.Kind) error {
	r.refs[fmt.Sprint(src, " ", dst, " ", k)]++
	return nil
}

func (r *fakeRouteTable) RemoveRoute(src, dst netip.Prefix, k routing.Kind) error {
	key := fmt.Sprint(src, " ", dst, " ", k)
	if r.refs[key] == 0 {
		return fmt.Errorf("no %s", key)
	}
	r.refs[key]--
	return nil
}

// TestPolicyRoutes: the route references each kind of policy takes, their
// release, and the refusal once the router is gone.
func TestPolicyRoutes(t *testing.T) {
	r := &fakeRouteTable{refs: map[string]int{}}
	var pr policyRoutes
	pr.setRouter(r)
	pols := []sa.Policy{
		{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.0.7/16")}, Dir: sa.DirOut, Action: sa.ActionProtect},
		{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.0.0/16"), Proto: 6}, Dir: sa.DirOut, Action: sa.ActionDrop},
		{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.5.0/24")}, Dir: sa.DirOut, Action: sa.ActionBypass},
		{Selector: sa.Selector{}, Dir: sa.DirOut, Action: sa.ActionProtect},
		{Selector: sa.Selector{Src: netip.MustParsePrefix("2001:db8::/32")}, Dir: sa.DirOut, Action: sa.ActionProtect},
		{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.0.0/16")}, Dir: sa.DirIn, Action: sa.ActionProtect},
		// A full tunnel for a LAN, and bypass-lan's pass policy.
		{Selector: sa.Selector{Src: netip.MustParsePrefix("198.18.1.7/24"), Dst: netip.MustParsePrefix("0.0.0.0/0")}, Dir: sa.DirOut, Action: sa.ActionProtect},
		{Selector: sa.Selector{Src: netip.MustParsePrefix("198.18.1.0/24"), Dst: netip.MustParsePrefix("198.18.1.0/24")}, Dir: sa.DirOut, Action: sa.ActionBypass},
		// A route-based interface's policy: no route.
		{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.9.0/24")}, Dir: sa.DirOut, Action: sa.ActionProtect, IfID: 7},
		// Host to host in transport mode (L2TP's udp/1701): whole
		// datagrams; a transport-mode template on a drop policy changes
		// nothing.
		{Selector: sa.Selector{Src: netip.MustParsePrefix("198.18.0.1/32"), Dst: netip.MustParsePrefix("198.18.0.2/32"), Proto: 17, SrcPorts: sa.PortRange{Lo: 1701, Hi: 1701}},
			Dir: sa.DirOut, Action: sa.ActionProtect, Mode: sa.ModeTransport},
		{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.18.0.3/32")}, Dir: sa.DirOut, Action: sa.ActionDrop, Mode: sa.ModeTransport},
	}
	for _, p := range pols {
		if err := pr.InstallPolicyRoute(p); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]int{
		"0.0.0.0/0 198.19.0.0/16 tunnel": 2, "0.0.0.0/0 198.19.5.0/24 throw": 1, "0.0.0.0/0 0.0.0.0/0 tunnel": 1,
		"::/0 ::/0 tunnel": 1, "2001:db8::/32 ::/0 tunnel": 1,
		"198.18.1.0/24 0.0.0.0/0 tunnel": 1, "198.18.1.0/24 198.18.1.0/24 throw": 1,
		"198.18.0.1/32 198.18.0.2/32 transport": 1, "0.0.0.0/0 198.18.0.3/32 tunnel": 1,
	}
	if len(r.refs) != len(want) {
		t.Errorf("references %v, want %v", r.refs, want)
	}
	for k, v := range want {
		if r.refs[k] != v {
			t.Errorf("%s: %d references, want %d (all: %v)", k, r.refs[k], v, r.refs)
		}
	}
	for _, p := range pols {
		if err := pr.RemovePolicyRoute(p); err != nil {
			t.Fatal(err)
		}
	}
	for k, v := range r.refs {
		if v != 0 {
			t.Errorf("%s: %d references left", k, v)
		}
	}
	pr.setRouter(nil)
	if err := pr.InstallPolicyRoute(pols[0]); !errors.Is(err, errNoRouter) {
		t.Errorf("InstallPolicyRoute without a router: %v, want errNoRouter", err)
	}
}

// TestPolicyRoutesNoIPv6: without IPv6 a selector of any address takes the
// IPv4 default route only.
func TestPolicyRoutesNoIPv6(t *testing.T) {
	r := &fakeRouteTable{refs: map[string]int{}}
	pr := policyRoutes{noIPv6: true}
	pr.setRouter(r)
	if err := pr.InstallPolicyRoute(sa.Policy{Dir: sa.DirOut, Action: sa.ActionProtect}); err != nil {
		t.Fatal(err)
	}
	if len(r.refs) != 1 || r.refs["0.0.0.0/0 0.0.0.0/0 tunnel"] != 1 {
		t.Errorf("references %v, want the IPv4 default route only", r.refs)
	}
}

// rpRouteTable is a fakeRouteTable whose peers' interface filters strictly
// (rpChecker).
type rpRouteTable struct {
	fakeRouteTable
	strict map[netip.Addr]bool
}

func (r *rpRouteTable) StrictRPFilter(peer netip.Addr) (string, bool, error) {
	return "wan0", r.strict[peer], nil
}

// TestPolicyRoutesStrictRP: a transport policy to a peer behind a strict
// reverse-path filter is installed with a warning that names the sysctl;
// one behind a loose filter, and tunnel policies, get none.
func TestPolicyRoutesStrictRP(t *testing.T) {
	var logs bytes.Buffer
	r := &rpRouteTable{fakeRouteTable{refs: map[string]int{}}, map[netip.Addr]bool{
		netip.MustParseAddr("198.18.0.2"): true}}
	pr := policyRoutes{log: slog.New(slog.NewTextHandler(&logs, nil))}
	pr.setRouter(r)
	pol := func(dst string, mode sa.Mode) sa.Policy {
		return sa.Policy{Selector: sa.Selector{Src: netip.MustParsePrefix("198.18.0.1/32"), Dst: netip.MustParsePrefix(dst)},
			Dir: sa.DirOut, Action: sa.ActionProtect, Mode: mode}
	}
	for _, p := range []sa.Policy{pol("198.18.0.3/32", sa.ModeTransport), pol("198.18.0.2/32", sa.ModeTunnel)} {
		if err := pr.InstallPolicyRoute(p); err != nil {
			t.Fatal(err)
		}
	}
	if logs.Len() != 0 {
		t.Errorf("warned for a loose filter or a tunnel:\n%s", logs.String())
	}
	if err := pr.InstallPolicyRoute(pol("198.18.0.2/32", sa.ModeTransport)); err != nil {
		t.Fatal(err)
	}
	if s := logs.String(); !strings.Contains(s, "level=WARN") || !strings.Contains(s, "peer=198.18.0.2") ||
		!strings.Contains(s, "net.ipv4.conf.wan0.rp_filter=2") {
		t.Errorf("no warning for the strict filter:\n%s", s)
	}
}
