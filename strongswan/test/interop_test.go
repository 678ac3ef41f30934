package strongswantest

import (
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// TestIPv6Outer runs IKE and ESP over IPv6 between the gateways with one
// CHILD_SA carrying both IPv4 and IPv6 inner traffic, as in the seeds'
// Celeron setup (IPv6-only uplink, dual-stack LANs).
func TestIPv6Outer(t *testing.T) {
	requireStrongSwan(t)
	p := newPair(t, pairOptions{})
	lanA := testbed.LANAV4.String() + "," + testbed.LANAV6.String()
	lanB := testbed.LANBV4.String() + "," + testbed.LANBV6.String()
	a := connection{Local: testbed.GwATransitV6.Addr().String(), Remote: testbed.GwBTransitV6.Addr().String(),
		LocalTS: lanA, RemoteTS: lanB, ESP: "chacha20poly1305"}
	b := connection{Local: a.Remote, Remote: a.Local, LocalTS: lanB, RemoteTS: lanA, ESP: a.ESP}
	p.load(a, b)
	p.initiate()

	sa := p.a.mustEspctl("sa", "list")
	for _, want := range []string{
		"src " + testbed.GwATransitV6.Addr().String() + " dst " + testbed.GwBTransitV6.Addr().String(),
		"src " + testbed.LANAV4.String() + " dst " + testbed.LANBV4.String(),
		"src " + testbed.LANAV6.String() + " dst " + testbed.LANBV6.String(),
	} {
		if !strings.Contains(sa, want) {
			t.Fatalf("A: espd's states lack %q:\n%s", want, sa)
		}
	}
	routes := p.a.tunnelRoutes()
	if !strings.Contains(routes, testbed.LANBV4.String()) || !strings.Contains(routes, testbed.LANBV6.String()) {
		t.Fatalf("A: routes into the TUN %q, want both of B's LANs", routes)
	}
	capA, err := p.topo.GwA.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 96})
	if err != nil {
		t.Fatal(err)
	}
	transfer(t, p.topo.Client, p.topo.Server, testbed.IPv4, transferBytes, 0)
	transfer(t, p.topo.Client, p.topo.Server, testbed.IPv6, transferBytes, 0)
	res, err := capA.Stop()
	if err != nil {
		t.Fatal(err)
	}
	v6ESP := 0 // bytes: frames may be segmentation-offload super-packets
	for _, f := range res.Frames {
		if f.Class == testbed.ClassESP || f.Class == testbed.ClassESPInUDP {
			if !f.Src.Is6() {
				t.Fatalf("ESP over IPv4 on an IPv6-only tunnel: %v", f.String())
			}
			v6ESP += f.Len
		}
	}
	t.Logf("A's transit link: %s", res.Summary())
	if v6ESP < 2*transferBytes {
		t.Errorf("want the transfers as ESP over IPv6, saw %d bytes of it", v6ESP)
	}
	c, _ := p.a.installedChild("net")
	if c.BytesOut < 2*transferBytes {
		t.Errorf("A: swanctl shows %d bytes out, want at least %d", c.BytesOut, 2*transferBytes)
	}
}

// TestInteropLibipsec: gateway A is charon with espd, gateway B is charon
// with strongSwan's own userspace ESP (kernel-libipsec, which always
// encapsulates ESP in UDP): for each cipher the tunnel comes up and TCP
// crosses both ways.
func TestInteropLibipsec(t *testing.T) {
	requireStrongSwan(t)
	p := newPair(t, pairOptions{B: charonOptions{Libipsec: true}})
	for _, suite := range []string{"aes128gcm16", "chacha20poly1305", "aes128-sha256"} {
		t.Logf("--- %s", suite)
		p.load(v4(suite))
		p.initiate()
		ca, _ := p.a.installedChild("net")
		if !ca.Encap {
			t.Fatalf("%s: A did not encapsulate in UDP for kernel-libipsec", suite)
		}
		if out := p.a.mustEspctl("sa", "list"); strings.Count(out, "alg "+suite+" ") != 2 {
			t.Fatalf("%s: espd's states do not use %s:\n%s", suite, suite, out)
		}
		transfer(t, p.topo.Client, p.topo.Server, testbed.IPv4, 8<<20, 0)
		transfer(t, p.topo.Server, p.topo.Client, testbed.IPv4, 8<<20, 0)
		ca, _ = p.a.installedChild("net")
		cb, _ := p.b.installedChild("net")
		if ca.BytesOut < 8<<20 || ca.BytesIn < 8<<20 || cb.BytesIn < 8<<20 || cb.BytesOut < 8<<20 {
			t.Fatalf("%s: counters too small: A %+v B %+v", suite, ca, cb)
		}
		p.a.mustSwanctl("--terminate", "--ike", "s2s", "--timeout", "10")
		checkEmpty(t, p.a)
		if !waitFor(5*time.Second, func() bool { return len(p.b.childSAs()) == 0 }) {
			t.Fatalf("%s: B still has CHILD_SAs after the terminate", suite)
		}
	}
}
