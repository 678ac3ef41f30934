package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/espd/espd/testbed"
)

// transportFirewallLoad is the marker of docs/transport.md's block that
// loads the firewall file and has /etc/nftables.conf include it.
const transportFirewallLoad = "transport firewall load"

// hostRuleset stands for the host's own firewall, which the page's table
// must leave as it is.
const hostRuleset = `table inet filter {
    chain input {
        type filter hook input priority filter; policy accept;
        tcp dport 22 accept
    }
}
`

// loadTransportFirewall runs docs/transport.md's load block as written on
// node, after the host's own ruleset: in a mount namespace of its own
// whose /etc is an overlay (the page's file written to
// /etc/nftables.d/espd-transport.nft there, the machine's /etc untouched)
// and with a systemctl that only records its arguments. It runs the block
// twice, as an administrator who changed the file would, and checks that
// the host's table stays, that the page's table is there once, and that
// /etc/nftables.conf includes the page's directory once.
func loadTransportFirewall(ctx context.Context, t *testing.T, node *testbed.Node, fw string) {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"upper/nftables.d", "work", "bin"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, text string, mode os.FileMode) {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(text), mode); err != nil {
			t.Fatal(err)
		}
	}
	write("upper/nftables.d/espd-transport.nft", fw, 0o644)
	write("upper/nftables.conf", "#!/usr/sbin/nft -f\nflush ruleset\n"+hostRuleset, 0o644)
	write("bin/systemctl", "#!/bin/sh\necho \"$@\" >> "+filepath.Join(dir, "systemctl.log")+"\n", 0o755)
	write("load.sh", transportBlock(t, "sh", transportFirewallLoad), 0o644)
	if out, err := node.Run(ctx, "sh", "-c", "printf '%s' \"$0\" | nft -f -", hostRuleset); err != nil {
		t.Fatalf("the host's own ruleset: %v\n%s", err, out)
	}
	script := fmt.Sprintf("mount -t overlay overlay -o lowerdir=/etc,upperdir=%[1]s/upper,workdir=%[1]s/work /etc\n"+
		"export PATH=%[1]s/bin:$PATH\nsh -e %[1]s/load.sh\nsh -e %[1]s/load.sh\ncat /etc/nftables.conf\n", dir)
	out, err := node.Run(ctx, "unshare", "--mount", "--propagation", "private", "sh", "-ec", script)
	if err != nil {
		t.Fatalf("docs/transport.md's %q block: %v\n%s", transportFirewallLoad, err, out)
	}
	if n := strings.Count(out, `include "/etc/nftables.d/*.nft"`); n != 1 {
		t.Errorf("/etc/nftables.conf includes the page's directory %d times after two loads, want once:\n%s", n, out)
	}
	if log, _ := os.ReadFile(filepath.Join(dir, "systemctl.log")); !strings.Contains(string(log), "enable nftables") {
		t.Errorf("the block did not enable nftables.service: %q", log)
	}
	rules, err := node.Run(ctx, "nft", "list", "ruleset")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rules, "table inet filter") || !strings.Contains(rules, "tcp dport 22 accept") {
		t.Errorf("the host's own table is gone after the page's table was loaded:\n%s", rules)
	}
	if n := strings.Count(rules, "table inet espd_transport"); n != 1 {
		t.Errorf("the page's table is in the ruleset %d times after two loads, want once:\n%s", n, rules)
	}
	if n := strings.Count(rules, "counter packets"); n != 1 {
		t.Errorf("%d counted drop rules after two loads, want the page's one:\n%s", n, rules)
	}
}
