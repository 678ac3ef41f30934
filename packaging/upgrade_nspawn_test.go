package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// TestStrongSwanUpdate runs docs/upgrade.md on the two gateways of
// TestPackagesUnderSystemd (Debian 12, then 13) with the charon-keyed
// tunnel of docs/deploy.md's section 6 up and pingers both ways, the
// transit link captured at both ends for the whole test.
//
// The security update is simulated: the strongSwan packages the gateways
// run, repacked with the version V+test1 (binaries unchanged, as in a
// Debian security revision, which keeps strongSwan's upstream version and
// ABI), in a second apt repository. The rebuilt packages are what
// docs/upgrade.md's procedure makes: packaging/build.sh run again from
// this checkout with ESPD_VERSION raised, whose plugin package's Depends
// are then pointed at V+test1 (the one thing a build machine with the
// update installed would make differently).
//
// It checks: `apt-get upgrade` (the page's block) keeps strongSwan back
// and names it, and the page's full-upgrade check shows the plugin's
// removal; on gateway B, `apt-get full-upgrade` removes strongswan-espd,
// upgrades strongSwan and leaves charon stopped (it cannot start without
// the plugin, and its journal says so as docs/upgrade.md quotes it),
// espd-ike running, and espd-ike's journal says within 90 s that no IKE
// daemon is there, with the advice; the page's install of the
// rebuilt packages brings B back (charon active with the plugin, traffic
// both ways within 60 s), and the same install on A, the procedure as
// meant, too; then `apt-get upgrade` keeps nothing back. Not one cleartext
// frame of the LANs on the transit link from the first check to the end.
func TestStrongSwanUpdate(t *testing.T) {
	for _, rel := range debianReleases {
		t.Run("debian"+rel, func(t *testing.T) { strongSwanUpdate(t, rel) })
	}
}

func strongSwanUpdate(t *testing.T, release string) {
	bed := newPackageBed(t, "nspawnupg"+release, false, release)
	bed.section6(t)
	gw := bed.gw
	ss := strings.TrimSpace(gw["A"].must(t, "dpkg-query", "-W", "-f", "${Version}", "strongswan-libcharon"))
	next := ss + "+test1"
	securityUpdate(t, filepath.Join(bed.debs, "mirror"), filepath.Join(bed.debs, "update"), ss, next)
	rebuilt := filepath.Join(bed.debs, "rebuilt")
	rebuildPackages(t, bed, release, rebuilt, ss, next)
	for _, name := range []string{"A", "B"} {
		gw[name].must(t, "sh", "-ec", "echo 'deb [trusted=yes] file:/mnt/espd/update ./' >> /etc/apt/sources.list")
	}

	caps := newTransitCaptures(t, bed)
	dir := t.TempDir()
	pingers := []*pinger{
		startPinger(t, bed.top.Client, dir, testbed.ServerV4.Addr()),
		startPinger(t, bed.top.Server, dir, testbed.ClientV4.Addr()),
	}
	start := time.Now()
	if !waitPassing(pingers, start, 30*time.Second) {
		t.Fatalf("no traffic both ways through the tunnel before the update")
	}
	versions := func(name string) string {
		out, _ := gw[name].run(nil, "dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev}${Version}\n", "strongswan-libcharon", "charon-systemd", "strongswan-espd", "espd")
		return out
	}

	// What apt does: upgrade keeps strongSwan back; full-upgrade would
	// remove the plugin.
	out := pageBlock(t, gw["A"], "/", "apt-get upgrade")
	if !strings.Contains(out, "kept back") || !strings.Contains(out, "strongswan-libcharon") || !strings.Contains(out, "charon-systemd") {
		t.Errorf("gateway A: docs/upgrade.md's apt-get upgrade does not keep strongSwan back:\n%s", out)
	}
	if v := versions("A"); !strings.Contains(v, "strongswan-libcharon ii "+ss+"\n") || !strings.Contains(v, "strongswan-espd ii ") {
		t.Errorf("gateway A after apt-get upgrade:\n%s\nwant strongSwan %s and the plugin as they were", v, ss)
	}
	if out := pageBlock(t, gw["A"], "/", "full-upgrade check"); !strings.Contains(out, "Remv strongswan-espd") {
		t.Errorf("gateway A: docs/upgrade.md's full-upgrade check does not show the plugin's removal:\n%s", out)
	}
	if !waitPassing(pingers, time.Now(), 30*time.Second) {
		t.Errorf("gateway A: the tunnel stopped after apt-get upgrade")
	}

	// The accident on B: full-upgrade removes the plugin and upgrades
	// strongSwan; charon cannot start; the gateway stays closed and says why.
	aptGet(t, gw["B"], "/", "apt-get update -qq && apt-get full-upgrade")
	upgraded := time.Now()
	if v := versions("B"); !strings.Contains(v, "strongswan-libcharon ii "+next+"\n") || strings.Contains(v, "strongswan-espd ii ") {
		t.Errorf("gateway B after apt-get full-upgrade:\n%s\nwant strongSwan %s and no plugin", v, next)
	}
	if p := gw["B"].show(t, "strongswan.service", "ActiveState", "Result"); p["ActiveState"] == "active" {
		t.Errorf("gateway B: strongswan.service %v after the plugin went: want charon stopped", p)
	}
	if p := gw["B"].show(t, "espd-ike.service", "ActiveState"); p["ActiveState"] != "active" {
		t.Errorf("gateway B: espd-ike.service %v after apt-get full-upgrade, want it running on", p)
	}
	var espdLog string
	if !testbed.Poll(90*time.Second, time.Second, func() bool {
		espdLog, _ = gw["B"].run(nil, "journalctl", "--no-pager", "-o", "cat", "-u", "espd-ike")
		return strings.Contains(espdLog, "no IKE daemon: charon's espd plugin is gone")
	}) {
		t.Errorf("gateway B: espd-ike's journal does not say within 90 s that charon's plugin is gone:\n%s", testbed.Tail(espdLog, 20))
	} else if !strings.Contains(espdLog, "docs/upgrade.md") {
		t.Errorf("gateway B: espd-ike's warning has no advice:\n%s", testbed.Tail(espdLog, 5))
	}
	charonLog, _ := gw["B"].run(nil, "journalctl", "--no-pager", "-o", "cat", "-u", "strongswan", "-n", "25")
	for _, want := range []string{"plugin 'espd': failed to load", "has unmet dependency: CUSTOM:socket"} {
		if !strings.Contains(charonLog, want) {
			t.Errorf("gateway B: charon's journal does not say %q, as docs/upgrade.md quotes it", want)
		}
	}
	replies := 0
	for _, p := range pingers {
		p.update()
		replies += p.repliesSince(upgraded.Add(time.Second))
	}
	t.Logf("gateway B after apt-get full-upgrade (%d replies to requests sent since): espd-ike says:\n%s\ncharon's journal:\n%s",
		replies, testbed.Tail(espdLog, 3), charonLog)
	if n := caps.leaksSince(start); n > 0 {
		t.Errorf("%d cleartext frames on the transit link with charon upgraded without its plugin", n)
	}

	// The fix, and the procedure: the rebuilt packages, installed with
	// the update, on B and then on A.
	for _, name := range []string{"B", "A"} {
		c := gw[name]
		pageBlock(t, c, "/mnt/espd/rebuilt", "install rebuilt")
		at := time.Now()
		if v := versions(name); !strings.Contains(v, "strongswan-libcharon ii "+next+"\n") || !strings.Contains(v, "charon-systemd ii "+next+"\n") ||
			!strings.Contains(v, "strongswan-espd ii ") {
			t.Errorf("gateway %s after docs/upgrade.md's install:\n%s\nwant strongSwan %s and the plugin", name, v, next)
		}
		if p := c.show(t, "strongswan.service", "ActiveState"); p["ActiveState"] != "active" {
			t.Errorf("gateway %s: strongswan.service %v after the install, want active", name, p)
		}
		if plugins := loadedPlugins(t, c); !strings.Contains(plugins, " espd ") {
			t.Errorf("gateway %s: charon has no espd plugin after the install: %s", name, plugins)
		}
		if !waitPassing(pingers, at, 60*time.Second) {
			t.Errorf("gateway %s: no traffic both ways within 60 s of docs/upgrade.md's install", name)
		} else {
			t.Logf("gateway %s: traffic both ways %v after the install", name, time.Since(at).Round(100*time.Millisecond))
		}
	}
	if out := pageBlock(t, gw["A"], "/", "apt-get upgrade"); strings.Contains(out, "kept back") {
		t.Errorf("gateway A: apt-get upgrade still keeps packages back after the procedure:\n%s", out)
	}
	if n := caps.leaksSince(start); n > 0 {
		t.Errorf("%d cleartext frames on the transit link during the update", n)
	}
	for _, r := range caps.stop(t) {
		t.Log(r.summary)
	}
}

// pageBlock runs docs/upgrade.md's block marked marker in the container,
// in dir, and returns its output.
func pageBlock(t *testing.T, c *container, dir, marker string) string {
	t.Helper()
	block := markedBlock(t, "../docs/upgrade.md", "sh", marker)
	out, err := c.run(nil, "env", "DEBIAN_FRONTEND=noninteractive", "sh", "-ec", "cd "+dir+"\n"+block)
	if err != nil {
		t.Fatalf("docs/upgrade.md's %q block in %s: %v\n%s", marker, dir, err, out)
	}
	return out
}

// securityUpdate writes to dir a flat apt repository of the strongSwan
// packages of mirror in version from, repacked as version to (every
// "(= from)" of their Depends too).
func securityUpdate(t *testing.T, mirror, dir, from, to string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	debs, _ := filepath.Glob(filepath.Join(mirror, "*_"+strings.ReplaceAll(from, ":", "%3a")+"_*.deb"))
	n := 0
	for _, deb := range debs {
		src, err := exec.Command("dpkg-deb", "-f", deb, "Source", "Package").Output()
		if err != nil {
			t.Fatal(err)
		}
		if f := strings.Fields(string(src)); len(f) < 2 || f[1] != "strongswan" {
			continue
		}
		repack(t, deb, dir, map[string]string{"Version: " + from: "Version: " + to, "(= " + from + ")": "(= " + to + ")"})
		n++
	}
	if n == 0 {
		t.Fatalf("no strongSwan package of version %s in %s", from, mirror)
	}
	scanPackages(t, dir)
}

// rebuildPackages runs packaging/build.sh again as docs/upgrade.md's step
// 2 does, ESPD_VERSION the installed one's with ".1", for this
// architecture and the release, into dir, and points the plugin's
// strongSwan Depends from the version from to to.
func rebuildPackages(t *testing.T, bed *packageBed, release, dir, from, to string) {
	t.Helper()
	version := strings.Split(bed.espdDeb, "_")[1] + ".1"
	tmp := t.TempDir()
	build := exec.Command("bash", "build.sh", "--release", release, "--arch", runtime.GOARCH, "-o", tmp)
	build.Env = append(os.Environ(), "ESPD_VERSION="+version)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("packaging/build.sh with ESPD_VERSION=%s: %v\n%s", version, err, out)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	espd, plugin := onePackage(t, tmp, "espd"), onePackage(t, tmp, "strongswan-espd")
	if b, err := os.ReadFile(filepath.Join(tmp, espd)); err != nil || os.WriteFile(filepath.Join(dir, espd), b, 0o644) != nil {
		t.Fatalf("copying %s: %v", espd, err)
	}
	repack(t, filepath.Join(tmp, plugin), dir, map[string]string{"(= " + from + ")": "(= " + to + ")"})
}

// repack rebuilds the package deb into dir with each key of edit replaced
// by its value in its control file.
func repack(t *testing.T, deb, dir string, edit map[string]string) {
	t.Helper()
	tree := t.TempDir()
	if err := os.Chmod(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("dpkg-deb", "-R", deb, tree).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -R %s: %v\n%s", deb, err, out)
	}
	control := filepath.Join(tree, "DEBIAN", "control")
	b, err := os.ReadFile(control)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for k, v := range edit {
		s = strings.ReplaceAll(s, k, v)
	}
	if err := os.WriteFile(control, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("dpkg-deb", "-b", "-Zxz", tree, dir).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -b %s: %v\n%s", deb, err, out)
	}
}

// scanPackages writes dir's Packages index.
func scanPackages(t *testing.T, dir string) {
	t.Helper()
	scan := exec.Command("dpkg-scanpackages", "--multiversion", ".")
	scan.Dir = dir
	idx, err := scan.Output()
	if err != nil {
		t.Fatalf("dpkg-scanpackages in %s: %v", dir, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "Packages"), idx, 0o644); err != nil {
		t.Fatal(err)
	}
}
