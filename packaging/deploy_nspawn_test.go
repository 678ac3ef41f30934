package packaging

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/espd/espd/testbed"
)

// TestDeployUnderSystemd runs docs/deploy.md's manual-keying path as
// written, sections 1 to 5 and then 7, on two booted containers of each
// Debian release (12, then 13) in the gateway namespaces of a test bed:
// the espd package built for all three architectures and installed with
// section 1's block, the keys made and copied, the configuration written,
// espd.service enabled and the doc's pings through the tunnel, a reload;
// then section 7's blocks, the purge included. Afterwards espd must not be
// installed, and neither its rules, its routes nor /var/lib/espd may be
// left on either gateway.
func TestDeployUnderSystemd(t *testing.T) {
	for _, rel := range debianReleases {
		t.Run("debian"+rel, func(t *testing.T) { deployUnderSystemd(t, rel) })
	}
}

func deployUnderSystemd(t *testing.T, release string) {
	rootfs := nspawnRootfs(t, release)
	debs := t.TempDir()
	build := exec.Command("bash", "build.sh", "--no-plugin", "-o", debs)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("packaging/build.sh: %v\n%s", err, out)
	}
	onePackage(t, debs, "espd")

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
				out, _ := c.run(nil, "journalctl", "--no-pager", "-o", "short-monotonic", "-u", "espd", "-u", "espd-holds")
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
		gw[name].must(t, "sh", "-ec", `echo 'APT::Get::Assume-Yes "true";' > /etc/apt/apt.conf.d/90espd-test`)
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
		if out, _ := c.run(nil, "dpkg-query", "-W", "-f", "${db:Status-Abbrev}", "espd"); strings.HasPrefix(out, "i") || strings.HasPrefix(out, "r") {
			t.Errorf("gateway %s: espd after the purge: dpkg status %q", name, out)
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
