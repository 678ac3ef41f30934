package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/espd/espd/config"
	"github.com/espd/espd/daemon"
	"github.com/espd/espd/testbed"
)

// heldFile is a good hold file: LAN 198.18.1.0/24's rule, 198.18.2.0/24 held.
const heldFile = "espd holds 2\nfrom 198.18.1.0/24\n198.18.2.0/24\nend 2\n"

// restoreIn runs espd --restore-holds on state (holds and interfaces
// record contents; nil: no file) in a fresh namespace, and returns the
// namespace, what it printed and its error.
func restoreIn(t *testing.T, holds []byte, ifaces func(path string)) (*testbed.Node, string, error) {
	t.Helper()
	if err := testbed.Available(); err != nil {
		t.Skip(err)
	}
	ns := testbed.NewNodeT(t, "restore")
	dir := t.TempDir()
	if holds != nil {
		if err := os.WriteFile(daemon.HoldFile(dir), holds, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if ifaces != nil {
		ifaces(daemon.InterfacesFile(dir))
	}
	var out bytes.Buffer
	err := ns.Do(func() error { return runRestoreHolds(daemon.Options{StateDir: dir}, &out) })
	t.Logf("espd --restore-holds: %v\n%s", err, out.String())
	return ns, out.String(), err
}

// requireHeld checks that ns holds what heldFile lists (or, with all,
// everything): an unmarked packet from the LAN to the held prefix meets a
// blackhole.
func requireHeld(t *testing.T, ns *testbed.Node, all bool) {
	t.Helper()
	routes := ns.MustIP(t, "route", "show", "table", "all", "proto", "229")
	rules := ns.MustIP(t, "rule", "show")
	want, rule := "blackhole 198.18.2.0/24", "from 198.18.1.0/24 lookup"
	if all {
		want, rule = "blackhole default", "not from all fwmark 0xe5d0 lookup"
	}
	if !strings.Contains(routes, want) || !strings.Contains(rules, rule) {
		t.Errorf("not held: want %q and a rule %q; routes:\n%s\nrules:\n%s", want, rule, routes, rules)
	}
}

func writeRecord(specs ...config.Interface) func(string) {
	return func(path string) {
		if err := daemon.WriteInterfaces(path, specs); err != nil {
			panic(err)
		}
	}
}

func linkExists(t *testing.T, ns *testbed.Node, name string) bool {
	_, err := ns.IP(t.Context(), "link", "show", name)
	return err == nil
}

// TestRestoreHoldsGood: a good state directory restores the holds and
// the interfaces, and succeeds.
func TestRestoreHoldsGood(t *testing.T) {
	ns, _, err := restoreIn(t, []byte(heldFile), writeRecord(config.Interface{Name: "rb1", IfID: 1}))
	if err != nil {
		t.Fatal(err)
	}
	requireHeld(t, ns, false)
	if !linkExists(t, ns, "rb1") {
		t.Error("rb1 not created")
	}
}

// TestRestoreHoldsDamagedRecord: a damaged record of interfaces (the old
// format without a trailer, or an empty file) does not stop the holds:
// they are restored, and the run fails naming the record.
func TestRestoreHoldsDamagedRecord(t *testing.T) {
	for name, data := range map[string]string{
		"trailerless": "# espd's route-based interfaces (name if_id mtu), created at boot by espd --restore-holds\nrb1 1 0\n",
		"empty":       "",
		"bad line":    "# espd's route-based interfaces (name if_id mtu), created at boot by espd --restore-holds\nrb1 one 0\n",
	} {
		t.Run(name, func(t *testing.T) {
			ns, _, err := restoreIn(t, []byte(heldFile), func(path string) {
				if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
					t.Fatal(err)
				}
			})
			if err == nil || !strings.Contains(err.Error(), filepath.Base(daemon.InterfacesFile(""))) {
				t.Errorf("err %v, want a failure naming the record", err)
			}
			requireHeld(t, ns, false)
		})
	}
}

// TestRestoreHoldsInterfaceFails: an interface that cannot be created
// (its name is a non-TUN device's: the loopback, a veth) fails the run,
// naming it, while the holds and the other interfaces are restored.
func TestRestoreHoldsInterfaceFails(t *testing.T) {
	var ns *testbed.Node
	ns, _, err := restoreIn(t, []byte(heldFile), writeRecord(
		config.Interface{Name: "lo", IfID: 1}, config.Interface{Name: "rb2", IfID: 2}))
	if err == nil || !strings.Contains(err.Error(), "lo (if_id 1)") {
		t.Errorf("err %v, want a failure naming lo", err)
	}
	requireHeld(t, ns, false)
	if !linkExists(t, ns, "rb2") {
		t.Error("rb2 not created after lo failed")
	}
}

// TestRestoreHoldsDamagedHolds: a hold file that does not check out
// holds everything (not nothing), says so, fails the run, and the
// interfaces are still created.
func TestRestoreHoldsDamagedHolds(t *testing.T) {
	for name, data := range map[string]string{
		"cut":   "espd holds 2\nfrom 198.18.1.0/24\n",
		"empty": "",
		"bad":   "espd holds 2\nfrom 198.18.1.0/24\n198.18.2.0/33\nend 2\n",
	} {
		t.Run(name, func(t *testing.T) {
			ns, out, err := restoreIn(t, []byte(data), writeRecord(config.Interface{Name: "rb1", IfID: 1}))
			if err == nil || !strings.Contains(err.Error(), "holds:") {
				t.Errorf("err %v, want a failure naming the hold file", err)
			}
			if !strings.Contains(out, "HOLDING EVERYTHING") {
				t.Errorf("output does not say it holds everything:\n%s", out)
			}
			requireHeld(t, ns, true)
			if !linkExists(t, ns, "rb1") {
				t.Error("rb1 not created")
			}
		})
	}
}
