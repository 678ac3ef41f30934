package testbed

import (
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func skipUnlessAvailable(t *testing.T) {
	t.Helper()
	if err := Available(); err != nil {
		t.Skip(err)
	}
	if _, err := exec.LookPath("ping"); err != nil {
		t.Skip("needs ping (iputils-ping)")
	}
}

func nsExists(name string) bool {
	_, err := os.Stat(filepath.Join(NetnsDir, name))
	return err == nil
}

// TestTopologyUpDown builds the line, checks addresses, forwarding and the
// absence of a route between the LANs, and checks that Close removes every
// namespace and stops the processes in them.
func TestTopologyUpDown(t *testing.T) {
	skipUnlessAvailable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	top, err := New(Options{Prefix: "etbtest", Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { top.Close() })
	names := map[string]bool{}
	for _, n := range top.Nodes() {
		if !nsExists(n.Name) {
			t.Fatalf("namespace %s missing", n.Name)
		}
		if names[n.Name] {
			t.Fatalf("namespace name %s used twice", n.Name)
		}
		names[n.Name] = true
	}

	out, err := top.GwA.IP(ctx, "-br", "addr", "show", "dev", IfTransit)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{GwATransitV4.String(), GwATransitV6.String()} {
		if !strings.Contains(out, want) {
			t.Errorf("gwA %s: %q lacks %s", IfTransit, out, want)
		}
	}
	if strings.Contains(out, "tentative") {
		t.Errorf("gwA transit address still tentative: %q", out)
	}
	if out, err := top.GwA.Run(ctx, "ip", "-6", "addr", "show", "tentative"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("tentative addresses in gwA: %q %v", out, err)
	}
	for _, gw := range []*Node{top.GwA, top.GwB} {
		for _, key := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
			out, err := gw.Run(ctx, "cat", "/proc/sys/"+key)
			if err != nil || strings.TrimSpace(out) != "1" {
				t.Errorf("%s %s = %q (%v), want 1", gw.Role, key, out, err)
			}
		}
	}
	// The hosts do not forward, whatever the machine does.
	for _, host := range []*Node{top.Client, top.Server} {
		for _, key := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
			if out, _ := host.Run(ctx, "cat", "/proc/sys/"+key); strings.TrimSpace(out) != "0" {
				t.Errorf("%s forwards: %s = %q", host.Role, key, out)
			}
		}
	}

	// Each link works in both families.
	pings := []struct {
		from *Node
		to   string
	}{
		{top.Client, GwALANV4.Addr().String()}, {top.Client, GwALANV6.Addr().String()},
		{top.GwA, GwBTransitV4.Addr().String()}, {top.GwA, GwBTransitV6.Addr().String()},
		{top.Server, GwBLANV4.Addr().String()}, {top.Server, GwBLANV6.Addr().String()},
		// The client's default route leads through gwA to its transit address.
		{top.Client, GwATransitV4.Addr().String()}, {top.Client, GwATransitV6.Addr().String()},
	}
	for _, p := range pings {
		r, err := p.from.Ping(ctx, mustAddr(p.to), PingOptions{Count: 2})
		if err != nil || !r.OK() {
			t.Errorf("ping %s from %s: %+v %v", p.to, p.from.Role, r, err)
		}
	}
	// Nothing connects the LANs.
	for _, dst := range []string{ServerV4.Addr().String(), ServerV6.Addr().String(), GwBTransitV4.Addr().String()} {
		r, err := top.Client.Ping(ctx, mustAddr(dst), PingOptions{Count: 1, Wait: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if r.Received != 0 {
			t.Errorf("client reaches %s without a tunnel:\n%s", dst, r.Output)
		}
	}

	// A process left running is stopped by Close, which also removes the
	// namespaces.
	p, err := top.GwA.Start(filepath.Join(t.TempDir(), "sleep.log"), "sleep", "60")
	if err != nil {
		t.Fatal(err)
	}
	if err := top.Close(); err != nil {
		t.Fatal(err)
	}
	if done, _ := p.Exited(); !done {
		t.Error("process still running after Close")
	}
	for name := range names {
		if nsExists(name) {
			t.Errorf("namespace %s left behind", name)
		}
	}
	if err := top.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestNewT checks that NewT's t.Cleanup removes the namespaces when a test
// ends early (t.Skip leaves through runtime.Goexit, as t.FailNow does).
func TestNewT(t *testing.T) {
	skipUnlessAvailable(t)
	var names []string
	t.Run("early-exit", func(t *testing.T) {
		top := NewT(t, Options{Prefix: "etbtest"})
		for _, n := range top.Nodes() {
			names = append(names, n.Name)
		}
		t.Skip("leaving early on purpose: the cleanup must still run")
	})
	if len(names) != 4 {
		t.Fatalf("got %d namespaces", len(names))
	}
	for _, name := range names {
		if nsExists(name) {
			t.Errorf("namespace %s left behind", name)
		}
	}
}

func TestBadMTU(t *testing.T) {
	skipUnlessAvailable(t)
	if _, err := New(Options{Prefix: "etbtest", TransitMTU: 1000}); err == nil {
		t.Fatal("MTU 1000 accepted")
	}
}

func TestRemoveStale(t *testing.T) {
	skipUnlessAvailable(t)
	// A pid that existed and is gone.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dead := cmd.Process.Pid
	name := "etbstale-client-" + itoa(dead) + "-1"
	live := "etbstale-client-" + itoa(os.Getpid()) + "-1"
	for _, n := range []string{name, live} {
		if _, err := addNamespace(n); err != nil {
			t.Fatal(err)
		}
		n := n
		t.Cleanup(func() { deleteNamespace(n) })
	}
	removed, err := RemoveStale("etbstale")
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != name {
		t.Errorf("removed %v, want [%s]", removed, name)
	}
	if nsExists(name) {
		t.Errorf("%s still there", name)
	}
	if !nsExists(live) {
		t.Errorf("%s (a live pid) removed", live)
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func itoa(i int) string { return strconv.Itoa(i) }

// TestNewNode creates a program's namespace and removes it.
func TestNewNode(t *testing.T) {
	if err := Available(); err != nil {
		t.Skip(err)
	}
	n, err := NewNode("etbprog", "guest")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(NetnsDir, n.Name)
	if _, err := os.Stat(path); err != nil || !strings.HasPrefix(n.Name, "etbprog-guest-") || n.Role != "guest" {
		t.Fatalf("namespace %q (role %q): %v", n.Name, n.Role, err)
	}
	if out, err := n.IP(context.Background(), "-o", "link", "show", "lo"); err != nil || !strings.Contains(out, "UP") {
		t.Errorf("loopback of %s: %v %q", n.Name, err, out)
	}
	if err := n.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("%s still exists after Remove: %v", path, err)
	}
}
