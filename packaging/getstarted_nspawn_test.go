package packaging

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/internal/docblock"
	"github.com/espd/espd/testbed"
)

// gettingStartedPage is the page TestGettingStarted runs; the marked table
// of its six values is gettingStartedValues.
const (
	gettingStartedPage   = "../docs/getting-started.md"
	gettingStartedValues = "getting-started values"
)

// TestGettingStarted runs docs/getting-started.md as written: the build
// box's block ("sh build packages", "sudo " taken off, as root) in an
// overlay of this checkout, so that dist/ is written there and not here;
// then, for Debian 12 and then 13, two booted containers (systemd as PID
// 1) in the gateway namespaces of a test bed, each given the two packages
// of its release in root's home (for the page's scp from the build box),
// run the page's blocks in its order: "sh install packages" in root's
// home, and the gateway blocks (runDeployBlock: scp and ping carried out
// by the test). The page's own pings must pass; the units it enables must
// be the ones that run, and charon's CHILD_SA must be espd's.
//
// Then, with default routes across the transit link in both main tables
// (so that what escapes espd crosses it in clear), pings between the LAN
// hosts both ways in both families, and the transit link captured at both
// ends, each gateway is rebooted in turn (powered off cleanly, the kernel
// state a reboot loses emptied, forwarding included, and booted again from
// the same root file system: packageBed.reboot): the tunnel must come back
// by itself, forwarding must be on again from the page's sysctl file, and
// the capture must see ESP and not one cleartext frame of the LANs, from
// the first ping to the last. Besides what TestPackagesUnderSystemd needs,
// the build box's block needs systemd-nspawn for the other release.
func TestGettingStarted(t *testing.T) {
	rootfs := map[string]string{}
	for _, rel := range debianReleases {
		rootfs[rel] = nspawnRootfs(t, rel)
	}
	for _, tool := range []string{"apt-get", "dpkg-scanpackages", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("CI=true: needs %s", tool)
			}
			t.Skipf("needs %s", tool)
		}
	}
	checkout, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	// The checkout as the build box has it; what the block writes stays in
	// the overlay's upper directory (persistentRoot).
	box := persistentRoot(t, checkout)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "bash", "-ec", sudoLess(markedBlock(t, gettingStartedPage, "sh", "build packages")))
	build.Dir = box
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("docs/getting-started.md's build block: %v\n%s", err, out)
	}
	dist := filepath.Join(box, "dist")
	for _, rel := range debianReleases {
		t.Run("debian"+rel, func(t *testing.T) { gettingStarted(t, rootfs[rel], dist, rel) })
	}
}

func gettingStarted(t *testing.T, rootfs, dist, release string) {
	espdDeb := onePackage(t, dist, "espd")
	plugins, _ := filepath.Glob(filepath.Join(dist, "strongswan-espd_*+deb"+release+"_"+runtime.GOARCH+".deb"))
	if len(plugins) != 1 {
		t.Fatalf("the build block made %q, want one plugin for Debian %s", plugins, release)
	}
	pluginDeb := filepath.Base(plugins[0])
	mirror := "mirror-" + release
	aptMirror(t, rootfs, filepath.Join(dist, mirror), release, espdDeb, pluginDeb)

	bed := &packageBed{
		top:  testbed.NewT(t, testbed.Options{Prefix: "nspawngs" + release}),
		gw:   map[string]*container{},
		debs: dist, espdDeb: espdDeb, pluginDeb: pluginDeb,
		roots:      map[string]string{},
		persistent: true,
	}
	for _, name := range []string{"A", "B"} {
		bed.roots[name] = persistentRoot(t, rootfs)
		bed.gw[name] = boot(t, bed.roots[name], false, dist, bed.node(name))
	}
	defer func() {
		if t.Failed() {
			bed.logJournals(t, 80)
		}
	}()
	for _, name := range []string{"A", "B"} {
		c := bed.gw[name]
		// The test's stand-ins: udev's mode for /dev/net/tun (now and at
		// boot), the links that ifupdown would bring up at boot, Debian's
		// mirror, apt's answer, and the scp of step 1.
		c.must(t, "chmod", "0666", "/dev/net/tun")
		installBootUnits(t, c, name)
		c.must(t, "sh", "-ec", fmt.Sprintf(`rm -f /etc/apt/sources.list.d/*
echo 'deb [trusted=yes] file:/mnt/espd/%s ./' > /etc/apt/sources.list
echo 'APT::Get::Assume-Yes "true";' > /etc/apt/apt.conf.d/90espd-test
apt-get update -qq
cp /mnt/espd/%s /mnt/espd/%s /root/`, mirror, espdDeb, pluginDeb))
	}

	runGettingStarted(t, bed)
	for _, name := range []string{"A", "B"} {
		c := bed.gw[name]
		for unit, want := range map[string]string{"espd-ike.service": "active enabled", "strongswan.service": "active enabled", "espd.service": "inactive disabled"} {
			if p := c.show(t, unit, "ActiveState", "UnitFileState"); p["ActiveState"]+" "+p["UnitFileState"] != want {
				t.Errorf("gateway %s: %s after the page: %v, want %s", name, unit, p, want)
			}
		}
		checkOneCharon(t, name, c)
	}
	if !testbed.Poll(30*time.Second, 200*time.Millisecond, func() bool { return bed.tunnelUp("A") && bed.tunnelUp("B") }) {
		t.Fatalf("after the page, espd does not hold charon's CHILD_SA on both gateways")
	}

	for _, name := range []string{"A", "B"} {
		peer := map[string][]netip.Prefix{"A": {testbed.GwBTransitV4, testbed.GwBTransitV6}, "B": {testbed.GwATransitV4, testbed.GwATransitV6}}[name]
		bed.node(name).MustIP(t, "-4", "route", "add", "default", "via", peer[0].Addr().String())
		bed.node(name).MustIP(t, "-6", "route", "add", "default", "via", peer[1].Addr().String())
	}
	caps := newTransitCaptures(t, bed)
	start := time.Now()
	pingers := lanPingers(t, bed.top)
	if !answered(pingers, start, 40) {
		for _, p := range pingers {
			t.Logf("%s: ping %s", p.name, p.state())
		}
		t.Fatalf("no steady traffic both ways between the LANs, IPv4 and IPv6, after the page")
	}

	for _, name := range []string{"A", "B"} {
		node := bed.node(name)
		// Forwarding is part of what a reboot loses: the page's sysctl file
		// must bring it back.
		forwarding := []string{"net.ipv4.ip_forward", "net.ipv6.conf.all.forwarding"}
		for _, key := range forwarding {
			if out, err := node.Run(t.Context(), "sysctl", "-qw", key+"=0"); err != nil {
				t.Fatalf("gateway %s: sysctl -w %s=0: %v\n%s", name, key, err, out)
			}
		}
		ev := &lifecycleEvent{name: "gateway " + name + " rebooted", start: time.Now()}
		ev.t0 = ev.start
		bed.reboot(t, ev, name, false)
		ev.done = time.Now()
		for _, key := range forwarding {
			if out, err := node.Run(t.Context(), "sysctl", "-n", key); err != nil || strings.TrimSpace(out) != "1" {
				t.Errorf("gateway %s after the boot: %s is %q (%v), want 1 from the page's sysctl file", name, key, strings.TrimSpace(out), err)
			}
		}
		bed.waitRecovered(t, ev, pingers)
		t.Logf("%s: the tunnel was back %v after the power-on", ev.name, ev.recovered.Sub(ev.t0).Round(10*time.Millisecond))
	}
	// Steady traffic again after the reboots, and its answers, before the
	// capture ends.
	if !answered(pingers, time.Now(), 40) {
		t.Errorf("no steady traffic both ways after the reboots")
	}
	end := time.Now()

	for _, r := range caps.stop(t) {
		w := counts(r.res, start, end)
		t.Logf("transit link %s: %s", r.side, w)
		if w.class[testbed.ClassESP]+w.class[testbed.ClassESPInUDP] == 0 {
			t.Errorf("transit link %s: no ESP captured: the capture does not see the tunnel", r.side)
		}
		for i, f := range r.res.Leaks(lanAddrs...) {
			if i < 10 {
				t.Errorf("cleartext on the transit link (%s) at %s: %s", r.side, f.Time.Format("15:04:05.000"), f.String())
			}
		}
		if !r.res.Complete() {
			t.Errorf("capture %s incomplete: %d dropped, %d over the limit", r.side, r.res.Drops, r.res.Overflow)
		}
	}
}

// answered waits, at most 30 s, until each pinger has had n answers to
// requests sent since (about n/20 s of traffic).
func answered(pingers []*pinger, since time.Time, n int) bool {
	return testbed.Poll(30*time.Second, 100*time.Millisecond, func() bool {
		for _, p := range pingers {
			if p.update(); p.repliesSince(since) < n {
				return false
			}
		}
		return true
	})
}

// runGettingStarted runs the page's blocks on bed's gateways in the page's
// order, all but the build box's: "sh install packages" in root's home on
// both, each gateway block on its gateways.
func runGettingStarted(t *testing.T, bed *packageBed) {
	t.Helper()
	blocks, err := docblock.Blocks(gettingStartedPage)
	if err != nil {
		t.Fatal(err)
	}
	ran := 0
	for _, b := range blocks {
		if b.Lang != "sh" || b.Marker == "" || b.Marker == "build packages" {
			continue
		}
		ran++
		if b.Marker == "install packages" {
			for _, name := range []string{"A", "B"} {
				aptGet(t, bed.gw[name], "/root", strings.TrimSpace(b.Text))
			}
			continue
		}
		gws, ok := pageGateways[b.Marker]
		if !ok {
			t.Fatalf("%s:%d: block marked %q: no gateway to run it on", gettingStartedPage, b.Line, b.Marker)
		}
		runDeployBlock(t, bed.gw, bed.top, deployBlock{gateways: gws, text: b.Text})
	}
	if ran < 8 {
		t.Fatalf("%s: only %d gateway blocks: the page's markers have changed", gettingStartedPage, ran)
	}
}

// pageGateways are the gateways a block runs on, by its marker.
var pageGateways = map[string][]string{"gateway A": {"A"}, "gateway B": {"B"}, "both gateways": {"A", "B"}}

// TestGettingStartedPromises checks what docs/getting-started.md promises
// of itself: at most 12 commands (lines of its blocks outside here-documents)
// per gateway; a marked table of at most 6 values; and every IP address or
// prefix in its blocks one of them, each of which appears in some block, so
// that replacing the table's values is all there is to edit.
func TestGettingStartedPromises(t *testing.T) {
	blocks, err := docblock.Blocks(gettingStartedPage)
	if err != nil {
		t.Fatal(err)
	}
	text, err := os.ReadFile(gettingStartedPage)
	if err != nil {
		t.Fatal(err)
	}
	tables := docblock.MarkedTables(docblock.Tables(string(text)), gettingStartedValues)
	if len(tables) != 1 || len(tables[0].Rows) < 2 {
		t.Fatalf("%s: want one table marked %q with its values, have %d", gettingStartedPage, gettingStartedValues, len(tables))
	}
	values := map[string]bool{}
	for _, row := range tables[0].Rows[1:] {
		for _, v := range strings.Split(strings.Trim(row[len(row)-1], "`"), ",") {
			values[v] = false
		}
	}
	if n := len(tables[0].Rows) - 1; n > 6 {
		t.Errorf("%s: %d values to edit, want at most 6", gettingStartedPage, n)
	}

	commands := map[string]int{}
	for _, b := range blocks {
		gws := pageGateways[b.Marker]
		if b.Marker == "install packages" {
			gws = pageGateways["both gateways"]
		}
		if b.Lang != "sh" || (gws == nil && b.Marker != "build packages") {
			continue
		}
		for _, l := range commandLines(b.Text) {
			for _, gw := range gws {
				commands[gw]++
			}
			for _, addr := range addressesIn(l) {
				if _, ok := values[addr]; !ok {
					t.Errorf("%s:%d: %q holds %s, which the table of values does not list", gettingStartedPage, b.Line, l, addr)
				}
				values[addr] = true
			}
		}
	}
	for _, gw := range []string{"A", "B"} {
		if commands[gw] == 0 || commands[gw] > 12 {
			t.Errorf("%s: %d commands on gateway %s, want 1 to 12", gettingStartedPage, commands[gw], gw)
		}
	}
	for v, used := range values {
		if !used {
			t.Errorf("%s: the table's value %s is in no block", gettingStartedPage, v)
		}
	}
	t.Logf("commands: gateway A %d, gateway B %d; values: %d", commands["A"], commands["B"], len(tables[0].Rows)-1)
}

// commandLines returns the lines of a shell block that an administrator
// types, here-document bodies included in the line that opens them, blank
// lines and comments left out.
func commandLines(text string) []string {
	var out []string
	end := ""
	for _, l := range strings.Split(text, "\n") {
		if end != "" {
			out[len(out)-1] += "\n" + l
			if strings.TrimSpace(l) == end {
				end = ""
			}
			continue
		}
		if t := strings.TrimSpace(l); t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		out = append(out, l)
		if _, doc, ok := strings.Cut(l, "<<"); ok {
			end = strings.Trim(strings.Fields(strings.TrimPrefix(doc, "-"))[0], `'"`)
		}
	}
	return out
}

// addressesIn returns the IP addresses and prefixes in s.
func addressesIn(s string) []string {
	var out []string
	for _, w := range strings.FieldsFunc(s, func(r rune) bool {
		return !strings.ContainsRune("0123456789abcdefABCDEF:./", r)
	}) {
		w = strings.Trim(w, ":.")
		if _, err := netip.ParsePrefix(w); err == nil {
			out = append(out, w)
		} else if _, err := netip.ParseAddr(w); err == nil {
			out = append(out, w)
		}
	}
	return out
}
