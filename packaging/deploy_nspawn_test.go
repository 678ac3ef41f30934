package packaging

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/espd/espd/testbed"
)

// TestDeployUnderSystemd runs docs/deploy.md from end to end as written,
// in the order an administrator takes it, on two booted containers of each
// Debian release (12, then 13) in the gateway namespaces of a test bed:
// the packages built for all three architectures; sections 1 to 5 (espd
// installed with section 1's block, keys made and copied, the
// configuration written, espd.service enabled, the doc's pings through the
// tunnel, a reload); section 6 with espd.service still running, from the
// plugin's install block (which must leave charon no failed bind on UDP
// 4500) to charon's tunnel and its pings; then section 7's blocks, the
// purge included. Afterwards neither package may be installed, and
// neither espd's rules, its routes, /var/lib/espd nor /etc/espd may be left
// on either gateway. The strongSwan packages come from a local mirror, as
// in TestPackagesUnderSystemd.
func TestDeployUnderSystemd(t *testing.T) {
	for _, rel := range debianReleases {
		t.Run("debian"+rel, func(t *testing.T) { deployUnderSystemd(t, rel) })
	}
}

func deployUnderSystemd(t *testing.T, release string) {
	rootfs := nspawnRootfs(t, release)
	debs := t.TempDir()
	build := exec.Command("bash", "build.sh", "--release", release, "-o", debs)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("packaging/build.sh: %v\n%s", err, out)
	}
	aptMirror(t, rootfs, filepath.Join(debs, "mirror"), release, onePackage(t, debs, "espd"), onePackage(t, debs, "strongswan-espd"))

	top := testbed.NewT(t, testbed.Options{Prefix: "nspawndp" + release})
	nodes := map[string]*testbed.Node{"A": top.GwA, "B": top.GwB}
	gw := map[string]*container{}
	for _, name := range []string{"A", "B"} {
		gw[name] = bootContainer(t, rootfs, debs, nodes[name])
	}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, name := range []string{"A", "B"} {
			if c := gw[name]; !c.exited() {
				out, _ := c.run(nil, "journalctl", "--no-pager", "-o", "short-monotonic", "-u", "espd", "-u", "espd-ike", "-u", "strongswan")
				t.Logf("journal of gateway %s:\n%s", name, testbed.Tail(out, 60))
			}
		}
	})
	install := markedBlock(t, "../docs/deploy.md", "sh", "install espd")
	for _, name := range []string{"A", "B"} {
		// udev's mode, which the container lacks (TestUnitUnderSystemd).
		gw[name].must(t, "chmod", "0666", "/dev/net/tun")
		// apt answers the purge's question itself, as the administrator
		// would (the commands are the doc's as written).
		// The mirror is its only apt source.
		gw[name].must(t, "sh", "-ec", `rm -f /etc/apt/sources.list.d/*
echo 'deb [trusted=yes] file:/mnt/espd/mirror ./' > /etc/apt/sources.list
echo 'APT::Get::Assume-Yes "true";' > /etc/apt/apt.conf.d/90espd-test
apt-get update -qq`)
		// The directory the packages were copied to holds every architecture.
		aptGet(t, gw[name], "/mnt/espd", install)
	}

	for _, b := range deployBlocks(t, "## 1.", "## 6.") {
		runDeployBlock(t, gw, top, b)
	}
	for _, name := range []string{"A", "B"} {
		if p := gw[name].show(t, "espd.service", "ActiveState", "UnitFileState"); p["ActiveState"] != "active" || p["UnitFileState"] != "enabled" {
			t.Errorf("gateway %s: espd.service after section 5: %v, want active and enabled", name, p)
		}
		stats := gw[name].must(t, "espctl", "sa", "list")
		if strings.Count(stats, "spi 0x") != 2 {
			t.Errorf("gateway %s: espctl sa list after section 5, want the two SAs:\n%s", name, stats)
		}
	}

	// Section 6 on a gateway that runs espd.service with section 4's SAs:
	// the plugin's install block stops it, so that the charon it starts
	// gets UDP 4500 (socket-default logs a failed bind while charon
	// starts, before the install returns; the plugin's advice a second
	// later says "could not open" too).
	plugin := markedBlock(t, "../docs/deploy.md", "sh", "install strongswan-espd")
	for _, name := range []string{"A", "B"} {
		aptGet(t, gw[name], "/mnt/espd", plugin)
		j := gw[name].must(t, "journalctl", "--no-pager", "-o", "cat", "-u", "strongswan")
		if strings.Contains(j, "unable to bind socket") || strings.Contains(j, "could not open") {
			t.Errorf("gateway %s: charon could not open its IKE ports after deploy.md's install block:\n%s", name, testbed.Tail(j, 20))
		}
	}
	for _, b := range deployBlocks(t, "## 6.", "## 7.") {
		runDeployBlock(t, gw, top, b)
	}

	section7 := deployBlocks(t, "## 7.", "## 8.")
	if len(section7) != 2 {
		t.Fatalf("docs/deploy.md's section 7 has %d gateway blocks, want 2 (stop and clean up; remove your files)", len(section7))
	}
	runDeployBlock(t, gw, top, section7[0])
	purge := markedBlock(t, "../docs/deploy.md", "sh", "purge")
	for _, name := range []string{"A", "B"} {
		aptGet(t, gw[name], "/", purge)
	}
	runDeployBlock(t, gw, top, section7[1])

	for _, name := range []string{"A", "B"} {
		c := gw[name]
		for _, pkg := range []string{"espd", "strongswan-espd"} {
			if out, _ := c.run(nil, "dpkg-query", "-W", "-f", "${db:Status-Abbrev}", pkg); strings.HasPrefix(out, "i") || strings.HasPrefix(out, "r") {
				t.Errorf("gateway %s: %s after the purge: dpkg status %q", name, pkg, out)
			}
		}
		for _, fam := range []string{"-4", "-6"} {
			if rules := c.must(t, "ip", fam, "rule", "show"); strings.Contains(rules, "58832") || strings.Contains(rules, "0xe5d0") {
				t.Errorf("gateway %s: ip %s rule after section 7:\n%s", name, fam, rules)
			}
			// A table that is gone is what we want; ip says so and fails.
			routes, err := c.run(nil, "ip", fam, "route", "show", "table", "58832")
			if (err == nil && strings.TrimSpace(routes) != "") || (err != nil && !strings.Contains(routes, "does not exist")) {
				t.Errorf("gateway %s: ip %s route show table 58832 after section 7:\n%s", name, fam, routes)
			}
		}
		for _, path := range []string{"/var/lib/espd", "/etc/espd"} {
			if out, err := c.run(nil, "test", "-e", path); err == nil {
				t.Errorf("gateway %s: %s is left after section 7 %s", name, path, out)
			}
		}
	}
}
