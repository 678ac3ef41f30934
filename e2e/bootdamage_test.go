package e2e

import (
	"context"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/config"
	"github.com/espd/espd/daemon"
	"github.com/espd/espd/testbed"
)

// TestBootRestoreDamaged boots gateway A afresh (new namespaces: no rule,
// no route in espd's table, a default route towards the transit link) with
// a damaged state directory, its transit link captured from before the
// boot, runs espd --restore-holds as espd-holds.service does, then sends
// the LAN's traffic to the held LAN B: whatever is damaged, --restore-holds
// fails naming it and not one cleartext frame of the LANs crosses the
// transit link. The first case, nothing recorded, shows that the capture
// sees the traffic when nothing holds it.
func TestBootRestoreDamaged(t *testing.T) {
	holds := "espd holds 2\nfrom " + testbed.LANAV4.String() + "\nfrom " + testbed.LANAV6.String() + "\n" +
		testbed.LANBV4.String() + "\n" + testbed.LANBV6.String() + "\nend 4\n"
	record := func(specs ...config.Interface) func(t *testing.T, path string) {
		return func(t *testing.T, path string) {
			if err := daemon.WriteInterfaces(path, specs); err != nil {
				t.Fatal(err)
			}
		}
	}
	legacy := func(t *testing.T, path string) { // the record before its trailer: refused
		body := "# espd's route-based interfaces (name if_id mtu), created at boot by espd --restore-holds\nrb1 1 0\n"
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name    string
		holds   string // "" : no hold file
		record  func(t *testing.T, path string)
		want    string // in the output of a failed run; "" : nothing recorded, the traffic leaks
		links   []string
		openRun bool
	}{
		{name: "nothing recorded", openRun: true},
		{name: "damaged record", holds: holds, record: legacy, want: "state file damaged"},
		{name: "interface not creatable", holds: holds, record: record(config.Interface{Name: "lo", IfID: 1},
			config.Interface{Name: "rb2", IfID: 2}), want: "lo (if_id 1)", links: []string{"rb2"}},
		{name: "damaged holds", holds: holds[:len(holds)-6], record: record(config.Interface{Name: "rb1", IfID: 1}),
			want: "HOLDING EVERYTHING", links: []string{"rb1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			top := newTopology(t, 0)
			defaultRoutes(t, top)
			dir := stateDir(t, top.GwA)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if tc.holds != "" {
				if err := os.WriteFile(daemon.HoldFile(dir), []byte(tc.holds), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			if tc.record != nil {
				tc.record(t, daemon.InterfacesFile(dir))
			}
			c, err := top.GwA.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 256})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Stop()
			out, err := top.GwA.Run(ctx, espdBin, "--restore-holds", "--state-dir", dir)
			t.Logf("espd --restore-holds: %v\n%s", err, out)
			switch {
			case tc.openRun && err != nil:
				t.Fatalf("--restore-holds with nothing recorded failed: %v", err)
			case !tc.openRun && (err == nil || !strings.Contains(out, tc.want)):
				t.Errorf("--restore-holds: %v, want a failure saying %q", err, tc.want)
			}
			for _, name := range tc.links {
				if _, err := top.GwA.IP(ctx, "link", "show", name); err != nil {
					t.Errorf("%s was not created: %v", name, err)
				}
			}
			s := startStreamPort(t, top, fcPort+2, 2*time.Millisecond, 30000)
			if !eventually(30*time.Second, func() bool { return s.sent.Load() >= 400 }) {
				t.Fatal("the client sent nothing")
			}
			if tc.openRun {
				// Nothing holds the LAN's traffic: it must reach the
				// server in clear, and the capture must see it.
				s.waitReceived(t, 50, 30*time.Second, "nothing recorded")
			}
			s.stop()
			res, err := c.Stop()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("gwA transit: %s; the server received %d of %d datagrams", res.Summary(), s.received(), s.sent.Load())
			if !res.Complete() {
				t.Errorf("capture incomplete: %d dropped, %d over the limit", res.Drops, res.Overflow)
			}
			inner := []netip.Addr{clientAddr(testbed.IPv4), serverAddr(testbed.IPv4), clientAddr(testbed.IPv6), serverAddr(testbed.IPv6)}
			leaks := res.Leaks(inner...)
			switch {
			case tc.openRun && len(leaks) == 0:
				t.Error("nothing recorded, yet the capture saw no cleartext: the check below proves nothing")
			case !tc.openRun && (len(leaks) > 0 || s.received() > 0):
				t.Errorf("%d cleartext frames on the transit link, %d datagrams at the server; want none", len(leaks), s.received())
				for i, f := range leaks {
					if i == 10 {
						break
					}
					t.Errorf("cleartext on transit: %s", f.String())
				}
			}
		})
	}
}
