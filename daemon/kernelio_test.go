package daemon

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/espd/espd/control"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/testbed"
	"github.com/espd/espd/tun"
)

// TestRunFailsCleanly makes each step of making the kernel I/O fail: Run
// returns the error (no panic) and leaves neither the TUN nor a rule.
func TestRunFailsCleanly(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, ns *testbed.Node, opts *Options)
		want  string
	}{
		{"TUN", func(t *testing.T, ns *testbed.Node, opts *Options) {
			opts.IO.TUN.MTU = 70000 // above any TUN's
		}, "tun"},
		{"sockets", func(t *testing.T, ns *testbed.Node, opts *Options) {
			// The encapsulation port is taken: the TUN and the router
			// exist by then and must go again.
			err := ns.Do(func() error {
				c, err := net.ListenPacket("udp4", ":4500")
				if err == nil {
					t.Cleanup(func() { c.Close() })
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		}, "4500"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := testbed.NewNodeT(t, "kio")
			opts := Options{
				Dataplane: dataplane.Config{Keepalive: -1},
				Control:   control.ServerConfig{Path: filepath.Join(t.TempDir(), "espd.sock")},
				IO:        IOConfig{TUN: tun.Config{Name: "esp0"}, NoIPv6: true},
			}
			tc.setup(t, ns, &opts)
			d, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			err = ns.Do(func() error { return d.Run(context.Background(), nil) })
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: %v, want an error naming %q", err, tc.want)
			}
			if _, err := ns.IP(context.Background(), "link", "show", "esp0"); err == nil {
				t.Error("the TUN device outlived the failed start")
			}
			if out := ns.MustIP(t, "rule", "show"); strings.Contains(out, "lookup 0x") || strings.Contains(out, "fwmark") {
				t.Errorf("rules left after the failed start:\n%s", out)
			}
		})
	}
}
