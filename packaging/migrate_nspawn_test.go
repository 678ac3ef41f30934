package packaging

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// TestMigrateFromStarter runs docs/migrate.md as written on two booted
// containers (Debian 12, then 13) in the gateway namespaces of a test bed.
// Before: each runs the ipsec starter and its charon (Debian 12's
// `strongswan` package, Debian 13's `strongswan-starter`) with the page's ipsec.conf connection (gateway B's mirrored:
// addresses swapped, auto=route) and a random pre-shared key in
// ipsec.secrets, loaded by the starter's charon; on A espd-ike, started
// beside it, fails to bind and names the starter's unit (the unit's
// sandbox hides root's charon from espd) and the command. Then the page's blocks,
// on both (B's swanctl.conf mirrored the same way, start_action = trap),
// with a pinger from LAN A to LAN B from the first block on. After: the
// starter and its charon are removed (ipsec.conf kept, ipsec.secrets
// gone), the key is in swanctl's file, root-only, the same key, and was
// printed by no block; the CHILD_SA is up with the SAs in espd, espd holds
// UDP 500 and 4500, no prohibit route is left, traffic crosses the tunnel
// and the transit link carried no cleartext of the LANs.
//
// The packages come from a local mirror as in TestPackagesUnderSystemd,
// with the starter's packages added to it.
func TestMigrateFromStarter(t *testing.T) {
	for _, rel := range debianReleases {
		t.Run("debian"+rel, func(t *testing.T) { migrateFromStarter(t, rel) })
	}
}

// mirrorIPsec swaps gateway A's and B's addresses and prefixes in a block
// of docs/migrate.md, and makes B the side that waits for traffic.
var mirrorIPsec = strings.NewReplacer(
	"198.18.0.1", "198.18.0.2", "198.18.0.2", "198.18.0.1",
	"198.18.1.0/24", "198.18.2.0/24", "198.18.2.0/24", "198.18.1.0/24",
	"auto=start", "auto=route",
	"start_action = start\n                close_action = start", "start_action = trap",
)

func migrateFromStarter(t *testing.T, release string) {
	rootfs := nspawnRootfs(t, release)
	for _, tool := range []string{"apt-get", "dpkg-scanpackages", "dpkg"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("needs %s", tool)
		}
	}
	debs := t.TempDir()
	build := exec.Command("bash", "build.sh", "--release", release, "--arch", runtime.GOARCH, "-o", debs)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("packaging/build.sh: %v\n%s", err, out)
	}
	mirror := filepath.Join(debs, "mirror")
	aptMirror(t, rootfs, mirror, release, onePackage(t, debs, "espd"), onePackage(t, debs, "strongswan-espd"))
	// The ipsec starter the box runs: Debian 12's strongswan package
	// brings it; Debian 13's brings charon-systemd instead, and a box
	// upgraded from 12 keeps strongswan-starter (with the charon it
	// recommends).
	starter := map[string]string{"12": "strongswan", "13": "strongswan-starter"}[release]
	mirrorAdd(t, rootfs, mirror, release, starter)

	top := testbed.NewT(t, testbed.Options{Prefix: "nspawnmig" + release})
	gw := map[string]*container{"A": bootContainer(t, rootfs, debs, top.GwA), "B": bootContainer(t, rootfs, debs, top.GwB)}
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range []string{"A", "B"} {
				out, _ := gw[name].run(nil, "journalctl", "--no-pager", "-o", "short-monotonic", "-u", "strongswan", "-u", "espd-ike", "-u", "strongswan-starter")
				t.Logf("journal of gateway %s:\n%s", name, testbed.Tail(out, 40))
			}
		}
	})
	key := make([]byte, 32)
	rand.Read(key)
	psk := "0s" + base64.StdEncoding.EncodeToString(key)
	conf := markedBlock(t, "../docs/migrate.md", "conf", "ipsec.conf gateway A")
	for _, name := range []string{"A", "B"} {
		c := gw[name]
		c.must(t, "chmod", "0666", "/dev/net/tun")
		c.must(t, "sh", "-ec", `rm -f /etc/apt/sources.list.d/*
echo 'deb [trusted=yes] file:/mnt/espd/mirror ./' > /etc/apt/sources.list
echo 'APT::Get::Assume-Yes "true";' > /etc/apt/apt.conf.d/90espd-test
apt-get update -qq`)
		aptGet(t, c, "/", "apt-get install "+starter)
		cf := conf
		if name == "B" {
			cf = mirrorIPsec.Replace(conf)
		}
		if out, err := c.run([]byte(cf), "install", "-m", "0644", "/dev/stdin", "/etc/ipsec.conf"); err != nil {
			t.Fatalf("gateway %s: writing ipsec.conf: %v\n%s", name, err, out)
		}
		if out, err := c.run([]byte("198.18.0.1 198.18.0.2 : PSK "+psk+"\n"), "install", "-m", "0600", "/dev/stdin", "/etc/ipsec.secrets"); err != nil {
			t.Fatalf("gateway %s: writing ipsec.secrets: %v\n%s", name, err, out)
		}
		c.must(t, "systemctl", "restart", "strongswan-starter")
		var status string
		if !testbed.Poll(30*time.Second, 500*time.Millisecond, func() bool {
			status, _ = c.run(nil, "ipsec", "statusall")
			return strings.Contains(status, "site:") && strings.Contains(status, "198.18.1.0/24")
		}) {
			t.Fatalf("gateway %s: the starter's charon did not load the page's conn:\n%s", name, status)
		}
	}

	// espd installed beside the starter, as an administrator might try
	// first: espd-ike cannot bind the IKE ports and names who holds them,
	// the likely cause and the command. The test then stops it and
	// forgets the failure (the page starts from a box without espd).
	aptGet(t, gw["A"], "/mnt/espd", "apt-get install ./"+onePackage(t, debs, "espd"))
	gw["A"].run(nil, "systemctl", "start", "espd-ike")
	var clash string
	if !testbed.Poll(30*time.Second, 500*time.Millisecond, func() bool {
		clash, _ = gw["A"].run(nil, "journalctl", "--no-pager", "-o", "cat", "-u", "espd-ike")
		return strings.Contains(clash, "held by")
	}) {
		t.Errorf("gateway A: espd-ike beside the starter's charon does not say who holds the port:\n%s", testbed.Tail(clash, 10))
	} else {
		for _, want := range []string{"address already in use", "strongswan-starter.service runs, likely the holder", "systemctl disable --now strongswan-starter.service", "docs/migrate.md"} {
			if !strings.Contains(clash, want) {
				t.Errorf("gateway A: espd-ike's bind error beside the starter does not say %q:\n%s", want, testbed.Tail(clash, 10))
			}
		}
	}
	gw["A"].run(nil, "systemctl", "stop", "espd-ike")
	gw["A"].must(t, "systemctl", "reset-failed", "espd-ike")

	run := func(name, dir, marker string) string {
		t.Helper()
		block := markedBlock(t, "../docs/migrate.md", "sh", marker)
		if name == "B" {
			block = mirrorIPsec.Replace(block)
		}
		out, err := gw[name].run([]byte("cd "+dir+"\n"+block), "env", "DEBIAN_FRONTEND=noninteractive", "sh", "-e")
		if err != nil {
			t.Fatalf("gateway %s: docs/migrate.md's %q block: %v\n%s", name, marker, err, out)
		}
		if strings.Contains(out, psk) || strings.Contains(out, psk[2:]) {
			t.Errorf("gateway %s: docs/migrate.md's %q block printed the pre-shared key", name, marker)
		}
		return out
	}
	for _, name := range []string{"A", "B"} {
		run(name, "/", "migrate stop starter")
	}
	caps := map[string]*testbed.Capture{}
	for name, n := range map[string]*testbed.Node{"A": top.GwA, "B": top.GwB} {
		k, err := n.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 256})
		if err != nil {
			t.Fatal(err)
		}
		caps[name] = k
		t.Cleanup(func() { k.Stop() })
	}
	pingers := []*pinger{startPinger(t, top.Client, t.TempDir(), testbed.ServerV4.Addr())}
	for _, name := range []string{"B", "A"} {
		run(name, "/mnt/espd", "migrate install")
		run(name, "/", "migrate swanctl gateway A")
		if out := run(name, "/", "migrate secret"); strings.TrimSpace(out) != "1" {
			t.Errorf("gateway %s: the secret block says %q, want 1 (one key moved)", name, out)
		}
	}
	// B answers; A's block waits for the CHILD_SA that it starts.
	bStart := make(chan string, 1)
	go func() {
		block := mirrorIPsec.Replace(markedBlock(t, "../docs/migrate.md", "sh", "migrate start"))
		out, err := gw["B"].run([]byte(block), "sh", "-e")
		if err != nil {
			out = "failed: " + err.Error() + "\n" + out
		}
		bStart <- out
	}()
	aOut := run("A", "/", "migrate start")
	if out := <-bStart; strings.HasPrefix(out, "failed: ") {
		t.Fatalf("gateway B: docs/migrate.md's \"migrate start\" block: %s", out)
	}
	t.Logf("gateway A: docs/migrate.md's last block:\n%s", aOut)

	for _, name := range []string{"A", "B"} {
		c := gw[name]
		if out, _ := c.run(nil, "dpkg-query", "-W", "-f", "${Package} ${db:Status-Abbrev}\n", "strongswan-starter", "strongswan-charon", "strongswan", "charon-systemd", "strongswan-espd"); strings.Count(out, " ii ") != 2 ||
			!strings.Contains(out, "charon-systemd ii ") || !strings.Contains(out, "strongswan-espd ii ") {
			t.Errorf("gateway %s: packages after the migration:\n%s\nwant charon-systemd and strongswan-espd, no starter", name, out)
		}
		checkOneCharon(t, name, c)
		if out, err := c.run(nil, "test", "-e", "/etc/ipsec.secrets"); err == nil {
			t.Errorf("gateway %s: /etc/ipsec.secrets is still there %s", name, out)
		}
		c.must(t, "test", "-f", "/etc/ipsec.conf")
		if st := strings.TrimSpace(c.must(t, "stat", "-c", "%a %U", "/etc/swanctl/conf.d/site-secret.conf")); st != "600 root" {
			t.Errorf("gateway %s: site-secret.conf is %s, want 600 root", name, st)
		}
		if s := c.must(t, "cat", "/etc/swanctl/conf.d/site-secret.conf"); !strings.Contains(s, "secret = "+psk+"\n") {
			t.Errorf("gateway %s: site-secret.conf does not hold the key of ipsec.secrets", name)
		}
		if r := c.must(t, "ip", "route", "show", "type", "prohibit"); strings.TrimSpace(r) != "" {
			t.Errorf("gateway %s: a prohibit route is left: %s", name, r)
		}
		ss := c.must(t, "ss", "-Hulpn")
		for _, port := range []string{":500 ", ":4500 "} {
			for _, l := range strings.Split(ss, "\n") {
				if strings.Contains(l, port) && !strings.Contains(l, `(("espd",`) {
					t.Errorf("gateway %s: UDP %s held by another process than espd: %s", name, port, l)
				}
			}
		}
		sas := c.must(t, "swanctl", "--list-sas", "--raw")
		m := regexp.MustCompile(`spi-in=([0-9a-f]{8}) spi-out=([0-9a-f]{8})`).FindStringSubmatch(sas)
		if m == nil {
			t.Errorf("gateway %s: no CHILD_SA:\n%s", name, sas)
			continue
		}
		list := c.must(t, "espctl", "sa", "list")
		for _, spi := range m[1:] {
			if !strings.Contains(list, "spi 0x"+spi+" ") {
				t.Errorf("gateway %s: espd has no SA with charon's SPI %s:\n%s", name, spi, list)
			}
		}
	}
	if !waitPassing(pingers, time.Now(), 30*time.Second) {
		t.Errorf("no ping reply from LAN B's server through the migrated tunnel within 30 s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if r, err := top.Server.Ping(ctx, testbed.ClientV4.Addr(), testbed.PingOptions{Count: 3}); err != nil || !r.OK() {
		t.Errorf("ping from LAN B's server to LAN A's client: %v\n%s", err, r.Output)
	}
	for name, k := range caps {
		res, err := k.Stop()
		if err != nil {
			t.Fatal(err)
		}
		if leaks := res.Leaks(lanAddrs...); len(leaks) > 0 {
			t.Errorf("at gateway %s's end: %d cleartext frames of the LANs on the transit link during the migration", name, len(leaks))
		}
		t.Logf("at gateway %s's end: %s", name, res.Summary())
	}
}

// mirrorAdd adds to the flat apt repository dir every package that
// installing pkgs on rootfs would take from Debian, as aptMirror does.
func mirrorAdd(t *testing.T, rootfs, dir, release string, pkgs ...string) {
	t.Helper()
	var lists []string
	if release != "12" {
		lists = releaseLists(t, rootfs)
	}
	argv := append([]string{"install", "-s", "-o", "Dir::State::status=" + filepath.Join(rootfs, "var/lib/dpkg/status"),
		"-o", "APT::Install-Recommends=true"}, lists...)
	out, err := exec.Command("apt-get", append(argv, pkgs...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("apt-get %s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	var want []string
	inst := regexp.MustCompile(`^Inst (\S+) (?:\[\S+\] )?\((\S+) `)
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if m := inst.FindStringSubmatch(sc.Text()); m != nil {
			want = append(want, m[1]+"="+m[2])
		}
	}
	dl := exec.Command("apt-get", append(append([]string{"download", "-qq"}, lists...), want...)...)
	dl.Dir = dir
	if out, err := dl.CombinedOutput(); err != nil {
		t.Fatalf("apt-get download %s: %v\n%s", strings.Join(want, " "), err, out)
	}
	if err := os.Remove(filepath.Join(dir, "Packages")); err != nil {
		t.Fatal(err)
	}
	scanPackages(t, dir)
	t.Logf("added to the containers' apt mirror: %s", strings.Join(want, " "))
}
