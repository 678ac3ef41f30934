package tun_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
	"github.com/espd/espd/tun"
)

// TestPersist: a persistent interface outlives its device with its routes,
// drops (and counts) what is routed into it while nobody has it open, is
// attached to again by Create, and goes with SetPersist(false) and Close,
// or with Delete.
func TestPersist(t *testing.T) {
	ns := testbed.NewNodeT(t, "tun")
	const name = "esppersist"
	dev := createIn(t, ns, tun.Config{Name: name, Persist: true})
	ns.MustIP(t, "route", "add", "198.18.77.0/24", "dev", name)
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}
	out := ns.MustIP(t, "-s", "link", "show", name)
	if !strings.Contains(out, name) {
		t.Fatalf("interface gone after Close: %s", out)
	}
	if r := ns.MustIP(t, "route", "show", "198.18.77.0/24"); !strings.Contains(r, "dev "+name) {
		t.Fatalf("route gone after Close: %q", r)
	}
	// What is routed into it now is dropped, never sent elsewhere.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := ns.SendUDP(ctx, netip.MustParseAddrPort("198.18.77.9:9"), testbed.UDPSendOptions{Count: 5, Size: 100}); err != nil {
		t.Logf("send: %v", err) // an error is fine: the packets must not leave either way
	}
	if drops := txDropped(t, ns, name); drops < 5 {
		t.Errorf("tx_dropped %d after 5 packets into the closed interface, want >= 5", drops)
	}

	dev2 := createIn(t, ns, tun.Config{Name: name})
	if dev2.Name() != name {
		t.Fatalf("attached to %q", dev2.Name())
	}
	if err := dev2.SetPersist(false); err != nil {
		t.Fatal(err)
	}
	dev2.Close()
	if out, err := ns.IP(context.Background(), "link", "show", name); err == nil {
		t.Fatalf("interface still there after SetPersist(false) and Close: %s", out)
	}

	createIn(t, ns, tun.Config{Name: name, Persist: true}).Close()
	if err := ns.Do(func() error { return tun.Delete(name) }); err != nil {
		t.Fatal(err)
	}
	if out, err := ns.IP(context.Background(), "link", "show", name); err == nil {
		t.Fatalf("interface still there after Delete: %s", out)
	}
	if err := ns.Do(func() error { return tun.Delete(name) }); err != nil {
		t.Errorf("Delete of a missing interface: %v", err)
	}
	ns.MustIP(t, "link", "add", "espveth0", "type", "veth", "peer", "name", "espveth1")
	if err := ns.Do(func() error { return tun.Delete("espveth0") }); !errors.Is(err, tun.ErrNotTUN) {
		t.Errorf("Delete of a veth interface: %v, want ErrNotTUN", err)
	}
}

// txDropped reads the interface's tx_dropped counter in ns.
func txDropped(t *testing.T, ns *testbed.Node, name string) int {
	t.Helper()
	var n int
	out := ns.MustIP(t, "-s", "-j", "link", "show", name)
	i := strings.Index(out, `"tx":`)
	if i < 0 {
		t.Fatalf("no tx stats: %s", out)
	}
	j := strings.Index(out[i:], `"dropped":`)
	if j < 0 {
		t.Fatalf("no tx dropped: %s", out)
	}
	for _, c := range out[i+j+len(`"dropped":`):] {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}
