package e2e

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// TestRouteBasedInterfaceLife follows a route-based interface through a
// gateway's life: espd creates it from its configuration file and a
// SIGHUP adds another (a policy for an interface ID without one draws a
// warning); a route into it stays while espd is killed and
// what is routed there is dropped (the kernel's tx_dropped), not sent
// anywhere else; after a reboot (interfaces gone) espd --restore-holds
// creates it again before espd runs; espd attaches to it; one removed
// from the file goes at the next SIGHUP, one removed while espd was
// stopped goes when espd starts; a refused reload leaves the interfaces
// as they were; espd --cleanup deletes the rest and their record.
func TestRouteBasedInterfaceLife(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	top := newTopology(t, 0)
	n := top.GwA
	conf := filepath.Join(t.TempDir(), "espd.toml")
	write := func(names ...string) {
		t.Helper()
		var b strings.Builder
		for i, name := range names {
			b.WriteString("[[interface]]\nname = \"" + name + "\"\nif_id = " + string(rune('1'+i)) + "\n\n")
		}
		if err := os.WriteFile(conf, []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(name string) bool {
		_, err := n.IP(ctx, "link", "show", name)
		return err == nil
	}
	write("rb1")
	e := startEspd(t, n, "--config", conf)
	if !exists("rb1") {
		t.Fatal("espd did not create rb1")
	}
	// A policy of an interface ID with no interface: said, not silent.
	e.mustCtl(t, "policy", "add", "--dir", "out", "--dst", "198.19.98.0/24", "--action", "drop", "--if-id", "9")
	if !eventually(5*time.Second, func() bool { return e.logContains("has no interface", "if_id=9") }) {
		t.Error("espd did not warn of a policy for if_id 9, which has no interface")
	}
	e.mustCtl(t, "policy", "del", "--dir", "out", "--dst", "198.19.98.0/24", "--if-id", "9")
	write("rb1", "rb2")
	if err := e.proc.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if !eventually(10*time.Second, func() bool { return exists("rb2") }) {
		t.Fatal("SIGHUP did not create rb2")
	}
	n.MustIP(t, "route", "add", "198.19.99.0/24", "dev", "rb1")

	e.kill(t)
	if !exists("rb1") || !exists("rb2") {
		t.Fatal("the interfaces went with espd")
	}
	if r := n.MustIP(t, "route", "get", "198.19.99.1"); !strings.Contains(r, "dev rb1") {
		t.Fatalf("the route into rb1 went with espd: %s", r)
	}
	before := txDropped(t, n, "rb1")
	if _, err := n.SendUDP(ctx, netip.MustParseAddrPort("198.19.99.1:9"), testbed.UDPSendOptions{Count: 5}); err != nil {
		t.Logf("send: %v", err)
	}
	if d := txDropped(t, n, "rb1") - before; d < 5 {
		t.Errorf("5 datagrams into rb1 with espd killed: tx_dropped +%d, want +5", d)
	}

	// The reboot: the interfaces are gone until --restore-holds.
	for _, name := range []string{"rb1", "rb2"} {
		n.MustIP(t, "link", "del", name)
	}
	out, err := n.Run(ctx, espdBin, "--restore-holds", "--state-dir", stateDir(t, n))
	if err != nil {
		t.Fatalf("espd --restore-holds: %v\n%s", err, out)
	}
	t.Logf("espd --restore-holds:\n%s", out)
	if !exists("rb1") || !exists("rb2") {
		t.Fatalf("--restore-holds did not create the interfaces:\n%s", out)
	}

	// rb2 leaves the file while espd is stopped: gone when it starts.
	write("rb1")
	e = startEspd(t, n, "--config", conf)
	if !eventually(10*time.Second, func() bool { return !exists("rb2") }) {
		t.Error("espd kept rb2, which its configuration no longer has")
	}
	if !exists("rb1") {
		t.Fatal("espd lost rb1")
	}
	// A refused reload (its new interface cannot be created: "lo" is no
	// TUN) leaves rb1 as it was, though the file changed its MTU: the
	// route into it is still there.
	n.MustIP(t, "route", "add", "198.19.97.0/24", "dev", "rb1")
	bad := "[[interface]]\nname = \"rb1\"\nif_id = 1\nmtu = 1300\n\n[[interface]]\nname = \"lo\"\nif_id = 9\n"
	if err := os.WriteFile(conf, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := e.proc.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if !eventually(10*time.Second, func() bool { return e.logContains("configuration refused") }) {
		t.Fatal("espd did not refuse a configuration whose interface cannot be created")
	}
	if r := n.MustIP(t, "route", "get", "198.19.97.1"); !strings.Contains(r, "dev rb1") {
		t.Errorf("a refused reload recreated rb1 (its route is gone): %s", r)
	}
	// rb1 leaves the file: gone at SIGHUP.
	write()
	if err := e.proc.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if !eventually(10*time.Second, func() bool { return !exists("rb1") }) {
		t.Error("SIGHUP kept rb1, which the configuration no longer has")
	}
	// And back, then --cleanup with espd stopped.
	write("rb1")
	if err := e.proc.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if !eventually(10*time.Second, func() bool { return exists("rb1") }) {
		t.Fatal("SIGHUP did not create rb1 again")
	}
	e.term(t)
	if !exists("rb1") {
		t.Fatal("rb1 went with espd's orderly stop")
	}
	out, err = n.Run(ctx, espdBin, "--cleanup", "--state-dir", stateDir(t, n), "--socket", e.sock, "--tun", tunName)
	if err != nil {
		t.Fatalf("espd --cleanup: %v\n%s", err, out)
	}
	if exists("rb1") {
		t.Errorf("--cleanup left rb1:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(stateDir(t, n), "interfaces")); !os.IsNotExist(err) {
		t.Errorf("--cleanup left the record of interfaces: %v", err)
	}
}

// txDropped reads an interface's tx_dropped counter in n.
func txDropped(t *testing.T, n *testbed.Node, name string) int {
	t.Helper()
	var links []struct {
		Stats struct {
			TX struct {
				Dropped int `json:"dropped"`
			} `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal([]byte(n.MustIP(t, "-j", "-s", "link", "show", name)), &links); err != nil || len(links) != 1 {
		t.Fatalf("ip -j -s link show %s: %v", name, err)
	}
	return links[0].Stats.TX.Dropped
}
