package strongswantest

import (
	"strings"
	"testing"
	"time"
)

// TestRouteBasedRefused: what charon asks for that espd does not honour
// fails the CHILD_SA, loudly, instead of being ignored: marks
// (mark_in/mark_out, VTI style) and an interface restriction, which espd
// would turn into a policy for all of the gateway's matching traffic,
// hardware offload and copy_dscp = yes. swanctl --initiate fails, charon
// logs why at its default level (naming the setting and the docs'
// section), and espd holds no state and no policy of it. Interface IDs
// (if_id_in/if_id_out, XFRM-interface style) are not refused: the plugin
// passes them to espd, which keeps route-based tunnels apart by them.
func TestRouteBasedRefused(t *testing.T) {
	requireStrongSwan(t)
	p := newPair(t, pairOptions{})
	for _, c := range []struct {
		name, child, log string
	}{
		{"mark", "        mark_in = 42\n        mark_out = 42", "marks (mark_in, mark_out, set_mark_in, set_mark_out) are not supported by espd"},
		{"interface", "        interface = wan0", "an interface restriction (interface) is not supported by espd"},
		{"hw_offload", "        hw_offload = yes", "hw_offload = yes; espd does the crypto itself"},
		{"copy_dscp", "        copy_dscp = yes", "refused: copy_dscp = yes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ca, cb := v4("aes128gcm16")
			ca.Child, cb.Child = c.child, c.child
			p.load(ca, cb)
			before := p.a.charonLogCount(c.log) + p.b.charonLogCount(c.log)
			out, err := p.a.swanctl("--initiate", "--child", "net", "--timeout", "20")
			if err == nil {
				t.Errorf("swanctl --initiate succeeded with %q:\n%s", c.child, out)
			}
			if !waitFor(10*time.Second, func() bool { return p.a.charonLogCount(c.log)+p.b.charonLogCount(c.log) > before }) {
				t.Errorf("charon did not log %q", c.log)
			}
			for _, g := range []*gateway{p.a, p.b} {
				s := g.espdSPIs()
				if len(s["in"])+len(s["out"]) > 0 || g.espdPolicies() > 0 {
					t.Errorf("%s: espd holds state of the refused CHILD_SA:\n%s\n%s", g.name, g.mustEspctl("sa", "list"), g.mustEspctl("policy", "list"))
				}
			}
			if strings.Contains(p.a.tunnelRoutes()+p.b.tunnelRoutes(), "198.18") {
				t.Errorf("espd routes into its TUN for a refused CHILD_SA: %q %q", p.a.tunnelRoutes(), p.b.tunnelRoutes())
			}
			p.a.swanctl("--terminate", "--ike", "s2s", "--timeout", "10")
		})
	}
}
