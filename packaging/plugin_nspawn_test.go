package packaging

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// TestPackagesUnderSystemd installs both packages, espd and
// strongswan-espd, built by packaging/build.sh from this checkout for all
// three architectures, with apt in two booted containers (systemd as PID 1,
// the root file system of TestUnitUnderSystemd) in the gateway namespaces
// of a test bed, and runs docs/deploy.md's section 6 (IKEv2 with the
// hand-off) in them as written, with the containers' own systemctl; once
// with Debian 12 and its strongSwan 5.9.8, once with Debian 13 and 6.0.1.
//
// Gateway A is a clean box that takes README.md's block ("Packages", in a
// checkout whose dist/ holds every architecture); gateway B already runs
// strongSwan's charon-systemd and takes deploy.md's two install blocks
// (sections 1 and 6, in a directory that holds every architecture), so its
// charon runs before the plugin is unpacked and only the plugin's postinst
// can make it load it.
// After the install, on each: strongswan.service is charon-systemd's and
// has the espd plugin loaded (swanctl --stats), it is enabled, no
// strongswan-charon or strongswan-starter is installed and the one charon
// that runs is charon-systemd. After deploy.md's section 6: espd-ike.service
// is active and espd, not charon, holds UDP 500 and 4500 (ss -ulpn), the
// plugin says in charon's journal that it connected to espd, the CHILD_SA
// is up (the doc's own wait), traffic from LAN A's client reaches LAN B's
// server through it, and espd holds the SAs charon negotiated.
//
// Where the strongSwan packages come from: the containers have no network.
// The test asks the machine's apt which packages the two .debs need on top
// of what the root file system holds (apt-get install -s against the root
// file system's dpkg status, recommended packages included, as a real
// install takes them), downloads exactly those versions with apt-get
// download (for Debian 12 the machine's package lists, with its security
// archive, which has the revision the plugin is pinned to, since a
// debootstrap of bookworm alone may hold an older one; for Debian 13
// private lists of the root file system's sources, trixie with its updates
// and security suites, so the machine's apt is not touched) and makes them a flat
// repository (dpkg-scanpackages) that the containers use as their only apt
// source, in place of Debian's mirror. apt in the container then resolves
// the dependencies itself, as on a real box, so a dependency that pulls in
// the ipsec starter is installed, starts its charon and fails the test.
// Besides what TestUnitUnderSystemd needs, it needs apt-get and
// dpkg-scanpackages (dpkg-dev), and skips without them (fails under
// CI=true), and network access to the machine's Debian mirror: a download
// that fails fails the test, since it may mean that the pinned revision
// is no longer there to install.
func TestPackagesUnderSystemd(t *testing.T) {
	for _, rel := range debianReleases {
		t.Run("debian"+rel, func(t *testing.T) { packagesUnderSystemd(t, rel) })
	}
}

func packagesUnderSystemd(t *testing.T, release string) {
	bed := newPackageBed(t, "nspawnss"+release, false, release)
	gw, top := bed.gw, bed.top
	last := bed.section6(t)

	for _, name := range []string{"A", "B"} {
		c := gw[name]
		// "Comes up at boot": the units section 6 leaves enabled are the
		// ones that run now, and espd.service (without the hand-off,
		// which would take UDP 4500 from espd-ike) is not among them.
		if p := c.show(t, "espd-ike.service", "ActiveState", "SubState", "UnitFileState"); p["ActiveState"] != "active" || p["UnitFileState"] != "enabled" {
			t.Errorf("gateway %s: espd-ike.service: %v, want active and enabled", name, p)
		}
		if p := c.show(t, "espd.service", "ActiveState", "UnitFileState"); p["ActiveState"] == "active" || p["UnitFileState"] == "enabled" {
			t.Errorf("gateway %s: espd.service: %v, want inactive and disabled beside espd-ike", name, p)
		}
		if p := c.show(t, "strongswan.service", "ActiveState", "UnitFileState"); p["ActiveState"] != "active" || p["UnitFileState"] != "enabled" {
			t.Errorf("gateway %s: strongswan.service after section 6: %v, want active and enabled", name, p)
		}
		ss := c.must(t, "ss", "-Hulpn")
		for _, port := range []string{"500", "4500"} {
			var holders []string
			for _, l := range strings.Split(ss, "\n") {
				if f := strings.Fields(l); len(f) >= 5 && strings.HasSuffix(f[3], ":"+port) {
					holders = append(holders, l)
				}
			}
			if len(holders) == 0 {
				t.Errorf("gateway %s: nothing holds UDP %s:\n%s", name, port, ss)
			}
			for _, h := range holders {
				if !strings.Contains(h, `(("espd",`) {
					t.Errorf("gateway %s: UDP %s is held by another process than espd: %s", name, port, h)
				}
			}
			t.Logf("gateway %s: UDP %s: %s", name, port, strings.Join(holders, "; "))
		}
		journal := c.must(t, "journalctl", "--no-pager", "-o", "cat", "-u", "strongswan")
		if !strings.Contains(journal, "espd: connected to espd") {
			t.Errorf("gateway %s: no \"espd: connected to espd\" in strongswan.service's journal:\n%s", name, testbed.Tail(journal, 30))
		}
		if !strings.Contains(journal, "receiving IKE on UDP ports 500 and 4500 from espd") {
			t.Errorf("gateway %s: charon does not take IKE from espd:\n%s", name, testbed.Tail(journal, 30))
		}
		checkOneCharon(t, name, c)
		// espd holds the CHILD_SA's two SAs that charon negotiated.
		sas := c.must(t, "swanctl", "--list-sas", "--raw")
		spis := regexp.MustCompile(`spi-in=([0-9a-f]{8}) spi-out=([0-9a-f]{8})`).FindStringSubmatch(sas)
		if spis == nil {
			t.Errorf("gateway %s: no CHILD_SA in swanctl --list-sas --raw:\n%s", name, sas)
			continue
		}
		list := c.must(t, "espctl", "sa", "list")
		t.Logf("gateway %s: charon's CHILD_SA has SPIs in %s, out %s", name, spis[1], spis[2])
		for _, spi := range spis[1:] {
			if !strings.Contains(list, "spi 0x"+spi+" ") {
				t.Errorf("gateway %s: espd has no SA with charon's SPI %s:\n%s", name, spi, list)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if r, err := top.Client.Ping(ctx, testbed.ServerV4.Addr(), testbed.PingOptions{Count: 3}); err != nil || !r.OK() {
		t.Errorf("ping from LAN A's client to LAN B's server: %v\n%s", err, r.Output)
	}

	runDeployBlock(t, gw, top, last)
	for _, name := range []string{"A", "B"} {
		if p := gw[name].show(t, "strongswan.service", "ActiveState", "UnitFileState"); p["ActiveState"] != "inactive" || p["UnitFileState"] != "disabled" {
			t.Errorf("gateway %s: after deploy.md's `systemctl disable --now strongswan`: %v", name, p)
		}
	}
}

// packageBed is a test bed of two gateway containers with both packages
// installed as TestPackagesUnderSystemd says.
type packageBed struct {
	top *testbed.Topology
	gw  map[string]*container // "A", "B"
	// debs is the machine's directory with the packages (/mnt/espd in the
	// containers) and mirror/; espdDeb and pluginDeb are their base names.
	debs, espdDeb, pluginDeb string
	// roots are the root file systems the containers booted, by gateway;
	// persistent ones (persistentRoot) can be booted again (reboot).
	roots      map[string]string
	persistent bool
}

// newPackageBed builds both packages for the Debian release ("12", "13")
// and the apt mirror, boots the two gateway containers of that release in
// a new test bed (namespaces named with prefix) and installs the packages
// as TestPackagesUnderSystemd says, with its checks. With persistent, each
// gateway boots a root file system of its own that outlives the container
// (bed.reboot).
func newPackageBed(t *testing.T, prefix string, persistent bool, release string) *packageBed {
	t.Helper()
	rootfs := nspawnRootfs(t, release)
	for _, tool := range []string{"apt-get", "dpkg-scanpackages", "dpkg"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("CI=true: needs %s", tool)
			}
			t.Skipf("needs %s", tool)
		}
	}

	// Both packages, as README.md's "Packages" builds them: espd for every
	// architecture, the plugin for this one and the release (it needs root;
	// nspawnRootfs made sure).
	debs := t.TempDir()
	build := exec.Command("bash", "build.sh", "--release", release, "-o", debs)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("packaging/build.sh: %v\n%s", err, out)
	}
	espdDeb := onePackage(t, debs, "espd")
	pluginDeb := onePackage(t, debs, "strongswan-espd")
	aptMirror(t, rootfs, filepath.Join(debs, "mirror"), release, espdDeb, pluginDeb)

	bed := &packageBed{
		top:  testbed.NewT(t, testbed.Options{Prefix: prefix}),
		gw:   map[string]*container{},
		debs: debs, espdDeb: espdDeb, pluginDeb: pluginDeb,
		roots:      map[string]string{"A": rootfs, "B": rootfs},
		persistent: persistent,
	}
	gw := bed.gw
	for _, name := range []string{"A", "B"} {
		if persistent {
			bed.roots[name] = persistentRoot(t, rootfs)
		}
		gw[name] = boot(t, bed.roots[name], !persistent, debs, bed.node(name))
	}
	t.Cleanup(func() {
		if t.Failed() {
			bed.logJournals(t, 60)
		}
	})
	for _, name := range []string{"A", "B"} {
		c := gw[name]
		// As in TestUnitUnderSystemd: udev's mode, which the container lacks.
		c.must(t, "chmod", "0666", "/dev/net/tun")
		// The mirror is the only apt source; apt-get answers yes by itself
		// (the commands below are the docs' as written).
		c.must(t, "sh", "-ec", `rm -f /etc/apt/sources.list.d/*
echo 'deb [trusted=yes] file:/mnt/espd/mirror ./' > /etc/apt/sources.list
echo 'APT::Get::Assume-Yes "true";' > /etc/apt/apt.conf.d/90espd-test
apt-get update -qq`)
	}

	// Gateway B: charon-systemd runs before the plugin package comes.
	aptGet(t, gw["B"], "/", "apt-get install charon-systemd")
	before := gw["B"].show(t, "strongswan.service", "ActiveState", "MainPID")
	if before["ActiveState"] != "active" {
		t.Fatalf("gateway B: installing charon-systemd left strongswan.service %v, want active", before)
	}
	if plugins := loadedPlugins(t, gw["B"]); strings.Contains(plugins, " espd ") {
		t.Fatalf("gateway B: charon loaded the espd plugin before it was installed: %s", plugins)
	}

	// Gateway A: README.md's block, in a checkout whose dist/ holds the
	// packages (the container has no sudo: root runs it without).
	readme := sudoLess(markedBlock(t, "../README.md", "sh", "readme-packages"))
	gw["A"].must(t, "sh", "-ec", "mkdir -p /root/espd && ln -s /mnt/espd /root/espd/dist")
	aptGet(t, gw["A"], "/root/espd", readme)
	// Gateway B: deploy.md's, in the directory the packages were copied to.
	// charon-systemd runs and holds UDP 4500 here, so espd.service does not
	// run between the two (after deploy.md's section 5 it would, and the
	// plugin's block stops it first); charon must not log a failed bind
	// (socket-default while charon starts, before the install returns; the
	// plugin's advice a second later says "could not open" too).
	aptGet(t, gw["B"], "/mnt/espd", markedBlock(t, "../docs/deploy.md", "sh", "install espd"))
	aptGet(t, gw["B"], "/mnt/espd", markedBlock(t, "../docs/deploy.md", "sh", "install strongswan-espd"))
	if j := gw["B"].must(t, "journalctl", "--no-pager", "-o", "cat", "-u", "strongswan"); strings.Contains(j, "unable to bind socket") || strings.Contains(j, "could not open") {
		t.Errorf("gateway B: charon could not open UDP 4500 after deploy.md's install block:\n%s", testbed.Tail(j, 20))
	}

	for _, name := range []string{"A", "B"} {
		c := gw[name]
		for _, pkg := range []string{"strongswan-starter", "strongswan-charon"} {
			if out, err := c.run(nil, "dpkg-query", "-W", "-f", "${db:Status-Abbrev}", pkg); err == nil && strings.HasPrefix(out, "ii") {
				t.Errorf("gateway %s: installing the packages installed %s", name, pkg)
			}
		}
		if p := c.show(t, "strongswan-starter.service", "LoadState", "ActiveState"); p["ActiveState"] == "active" {
			t.Errorf("gateway %s: strongswan-starter.service runs: %v", name, p)
		}
		p := c.show(t, "strongswan.service", "ActiveState", "ExecMainPID", "UnitFileState")
		if p["ActiveState"] != "active" || p["UnitFileState"] != "enabled" {
			t.Errorf("gateway %s: strongswan.service after the install: %v, want active and enabled", name, p)
		}
		// With the packages installed, swanctl finds every plugin of the
		// release's list (Debian's charon-systemd alone lacks a dozen).
		if out := c.must(t, "swanctl", "--stats"); strings.Contains(out, "failed to load") {
			t.Errorf("gateway %s: after the install swanctl says plugins failed to load:\n%s", name, out)
		}
		if plugins := loadedPlugins(t, c); !strings.Contains(plugins, " espd ") {
			t.Errorf("gateway %s: strongswan.service's charon has no espd plugin loaded: %s", name, plugins)
		}
		checkOneCharon(t, name, c)
		t.Logf("gateway %s: strongswan.service %v, %s", name, p, strings.TrimSpace(loadedPlugins(t, c)))
	}
	if after := gw["B"].show(t, "strongswan.service", "MainPID"); after["MainPID"] == before["MainPID"] {
		t.Errorf("gateway B: the plugin's install did not restart the charon that ran before (MainPID %s)", after["MainPID"])
	}
	if t.Failed() {
		t.FailNow()
	}

	return bed
}

// logJournals logs the last lines of the journals of charon and espd on
// each gateway whose container runs.
func (bed *packageBed) logJournals(t *testing.T, lines int) {
	t.Helper()
	for _, name := range []string{"A", "B"} {
		if c := bed.gw[name]; !c.exited() {
			out, _ := c.run(nil, "journalctl", "--no-pager", "-o", "short-monotonic", "-u", "strongswan", "-u", "espd-ike", "-u", "espd", "-u", "espd-holds", "-u", "strongswan-starter")
			t.Logf("journal of gateway %s:\n%s", name, testbed.Tail(out, lines))
		}
	}
}

// node returns the gateway's test bed namespace.
func (bed *packageBed) node(name string) *testbed.Node {
	return map[string]*testbed.Node{"A": bed.top.GwA, "B": bed.top.GwB}[name]
}

// section6 runs docs/deploy.md's section 6, as written, on both gateways,
// up to the block that takes charon down for section 7, which it returns.
func (bed *packageBed) section6(t *testing.T) deployBlock {
	t.Helper()
	blocks := deployBlocks(t, "## 6.", "## 7.")
	last := len(blocks) - 1
	if !strings.Contains(blocks[last].text, "systemctl disable --now strongswan") {
		t.Fatalf("docs/deploy.md's last block of section 6 is not `systemctl disable --now strongswan`:\n%s", blocks[last].text)
	}
	for _, b := range blocks[:last] {
		runDeployBlock(t, bed.gw, bed.top, b)
	}
	return blocks[last]
}

// loadedPlugins returns the "loaded plugins:" line of swanctl --stats.
func loadedPlugins(t *testing.T, c *container) string {
	t.Helper()
	out := c.must(t, "swanctl", "--stats")
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "loaded plugins:") {
			return l + " "
		}
	}
	t.Fatalf("swanctl --stats has no \"loaded plugins:\" line:\n%s", out)
	return ""
}

// checkOneCharon checks that the one charon process in the container is
// strongswan.service's charon-systemd: no ipsec starter, no second charon.
func checkOneCharon(t *testing.T, name string, c *container) {
	t.Helper()
	var charons []string
	for _, l := range strings.Split(c.must(t, "ps", "-eo", "pid=,comm="), "\n") {
		f := strings.Fields(l)
		if len(f) == 2 && (strings.HasPrefix(f[1], "charon") || f[1] == "starter") {
			charons = append(charons, l)
		}
	}
	main := c.show(t, "strongswan.service", "MainPID")["MainPID"]
	if len(charons) != 1 || strings.Fields(charons[0])[0] != main || strings.Fields(charons[0])[1] != "charon-systemd" {
		t.Errorf("gateway %s: charon processes %q, want only strongswan.service's charon-systemd (MainPID %s)", name, charons, main)
	}
}
