package packaging

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// The root file systems the booted tests boot, one per Debian release,
// made by packaging/nspawn-rootfs.sh --release R (the variable named by
// rootfsEnv overrides the path).
var (
	debianReleases = []string{"12", "13"}
	rootfsEnv      = map[string]string{"12": "ESPD_NSPAWN_ROOTFS", "13": "ESPD_NSPAWN_ROOTFS_13"}
	rootfsDefault  = map[string]string{"12": "/var/cache/espd-nspawn/rootfs", "13": "/var/cache/espd-nspawn/rootfs-13"}
)

const nspawnStamp = ".espd-nspawn"

// nspawnRootfs returns the root file system to boot, or skips the test with
// the reason it cannot run here; under CI=true that is a failure, since
// .ci/run provides all of it (root, systemd-container, util-linux, the root
// file system).
func nspawnRootfs(t *testing.T, release string) string {
	t.Helper()
	skip := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true: "+format, args...)
		}
		t.Skipf(format, args...)
	}
	if os.Geteuid() != 0 {
		skip("needs root to run systemd-nspawn")
	}
	if _, err := exec.LookPath("systemd-nspawn"); err != nil {
		skip("needs systemd-nspawn (apt-get install systemd-container)")
	}
	for _, tool := range []string{"nsenter", "setpriv", "ping", "env"} {
		if _, err := exec.LookPath(tool); err != nil {
			skip("needs %s", tool)
		}
	}
	if err := testbed.Available(); err != nil {
		skip("%v", err)
	}
	dir := os.Getenv(rootfsEnv[release])
	if dir == "" {
		dir = rootfsDefault[release]
	}
	if _, err := os.Stat(filepath.Join(dir, nspawnStamp)); err != nil {
		skip("no Debian %s root file system to boot at %s (%v): sudo bash packaging/nspawn-rootfs.sh --release %s %s", release, dir, err, release, dir)
	}
	return dir
}

// containers numbers the containers booted by this process.
var containers atomic.Int64

// TestUnitUnderSystemd runs each packaged unit (espd.service, and
// espd-ike.service with the IKE hand-off) under a real systemd: it builds
// the espd package from this checkout, boots a Debian 12 and a Debian 13
// container in turn (systemd as PID 1, cgroup v2) in gateway A's namespace of a test bed, installs the
// package with dpkg, gives it a configuration file with a chacha20poly1305
// tunnel and key files, and starts the unit with all its sandboxing
// (DevicePolicy= included). The start must return only once espd has sent
// READY=1 (Type=notify) and leave the unit running without a restart; espd
// must run as the espd user with exactly the unit's capabilities,
// no_new_privs, a seccomp filter and a mount namespace of its own; espctl
// must answer; with the hand-off UDP port 500 must be bound; traffic must
// cross the tunnel to gateway B (espd started as the unit starts it,
// TestServiceAsUnit's way); `systemctl reload` must re-read the file with
// the tunnel still up, and `systemctl stop` must stop espd cleanly; with
// a drop-in that empties DeviceAllow=, espd must fail at start and say
// that the device cgroup denies /dev/net/tun.
func TestUnitUnderSystemd(t *testing.T) {
	rootfs := map[string]string{}
	for _, rel := range debianReleases {
		rootfs[rel] = nspawnRootfs(t, rel)
	}

	// The package, as README.md's "Packages" builds it (this machine's
	// architecture, no plugin).
	debs := t.TempDir()
	build := exec.Command("bash", "build.sh", "--no-plugin", "--arch", runtime.GOARCH, "-o", debs)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("packaging/build.sh: %v\n%s", err, out)
	}
	matches, _ := filepath.Glob(filepath.Join(debs, "espd_*_"+runtime.GOARCH+".deb"))
	if len(matches) != 1 {
		t.Fatalf("packaging/build.sh made %q, want one espd package", matches)
	}
	deb := "/mnt/espd/" + filepath.Base(matches[0])

	for _, rel := range debianReleases {
		for _, name := range []string{plainUnit, handoffUnit} {
			t.Run("debian"+rel+"/"+name, func(t *testing.T) { unitUnderSystemd(t, rootfs[rel], deb, debs, name) })
		}
	}
}

// unitUnderSystemd is TestUnitUnderSystemd for the unit name, with the
// package deb (a path in the container) in the directory debs.
func unitUnderSystemd(t *testing.T, rootfs, deb, debs, name string) {
	u := loadUnit(t, name)
	handoff := slices.Contains(u.execStart(t), handoffFlag)
	top := testbed.NewT(t, testbed.Options{Prefix: "nspawn"})
	c := bootContainer(t, rootfs, debs, top.GwA)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := c.run(nil, "journalctl", "--no-pager", "-o", "short-monotonic", "-u", name)
			t.Logf("journal of %s in the container:\n%s", name, testbed.Tail(out, 60))
		}
	})

	// udev makes /dev/net/tun 0666 (50-udev-default.rules); there is no
	// udev in a container. The node is the container's own.
	c.must(t, "chmod", "0666", "/dev/net/tun")
	c.must(t, "dpkg", "-i", deb)

	ab, ba := hexKey(t, 36), hexKey(t, 36)
	c.writeFile(t, "/etc/espd/out.key", ab+"\n")
	c.writeFile(t, "/etc/espd/in.key", ba+"\n")
	c.writeFile(t, configPath, gatewayConfig(testbed.GwATransitV4.Addr().String(), testbed.GwBTransitV4.Addr().String(),
		testbed.LANAV4.String(), testbed.LANBV4.String()))
	c.must(t, "systemctl", "restart", name)
	p := c.show(t, name, "Type", "ActiveState", "SubState", "NRestarts", "MainPID")
	if p["Type"] != "notify" || p["ActiveState"] != "active" || p["SubState"] != "running" || p["NRestarts"] != "0" {
		t.Fatalf("after systemctl restart: %v, want Type=notify, active, running, no restart", p)
	}

	// The sandbox is in force: espd's credentials and namespaces as the
	// container sees them.
	pid := p["MainPID"]
	status := c.must(t, "cat", "/proc/"+pid+"/status")
	uid := strings.TrimSpace(c.must(t, "id", "-u", "espd"))
	var capMask uint64
	for _, name := range u.caps(t) {
		capMask |= 1 << map[string]uint{"CAP_NET_BIND_SERVICE": 10, "CAP_NET_ADMIN": 12, "CAP_NET_RAW": 13}[name]
	}
	want := []string{
		fmt.Sprintf("Uid:\t%s\t%s\t%s\t%s", uid, uid, uid, uid),
		fmt.Sprintf("CapEff:\t%016x", capMask), fmt.Sprintf("CapBnd:\t%016x", capMask), fmt.Sprintf("CapAmb:\t%016x", capMask),
		"NoNewPrivs:\t1", "Seccomp:\t2",
	}
	for _, w := range want {
		if !strings.Contains(status, w+"\n") {
			t.Errorf("espd's /proc/%s/status has no %q:\n%s", pid, w, status)
		}
	}
	if a, b := c.must(t, "readlink", "/proc/1/ns/mnt"), c.must(t, "readlink", "/proc/"+pid+"/ns/mnt"); a == b {
		t.Errorf("espd shares the mount namespace of the container's systemd (%s): no ProtectSystem=", a)
	}

	if out := c.must(t, "espctl", "sa", "list"); !strings.Contains(out, "chacha20poly1305") {
		t.Fatalf("espctl sa list in the container:\n%s", out)
	}

	b := startService(t, top.GwB, u, serviceRoot(t,
		gatewayConfig(testbed.GwBTransitV4.Addr().String(), testbed.GwATransitV4.Addr().String(), testbed.LANBV4.String(), testbed.LANAV4.String()),
		map[string]string{"out.key": ba, "in.key": ab}), u.caps(t))
	b.expect(t, "READY=1")

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if handoff {
		out, err := top.GwA.Run(ctx, "cat", "/proc/net/udp")
		if err != nil || !strings.Contains(out, ":01F4 ") {
			t.Fatalf("%s is active, but nothing listens on UDP port 500 in its namespace: %v\n%s", name, err, out)
		}
	}
	if r, err := top.Client.Ping(ctx, testbed.ServerV4.Addr(), testbed.PingOptions{Count: 3}); err != nil || !r.OK() {
		t.Fatalf("ping through the tunnel: %v\n%s", err, r.Output)
	}

	c.must(t, "systemctl", "reload", name)
	if !testbed.Poll(5*time.Second, 100*time.Millisecond, func() bool {
		out, _ := c.run(nil, "journalctl", "--no-pager", "-o", "cat", "-u", name)
		return testbed.CountLines(out, "configuration reloaded", "states=2", "policies=2") > 0
	}) {
		t.Errorf("no \"configuration reloaded\" line after systemctl reload")
	}
	if p := c.show(t, name, "ActiveState", "MainPID"); p["ActiveState"] != "active" || p["MainPID"] != pid {
		t.Errorf("after systemctl reload: %v, want active with MainPID=%s", p, pid)
	}
	if r, err := top.Client.Ping(ctx, testbed.ServerV4.Addr(), testbed.PingOptions{Count: 3}); err != nil || !r.OK() {
		t.Fatalf("ping through the tunnel after the reload: %v\n%s", err, r.Output)
	}

	// The unit's system call filter lets the TUN writer have its io_uring:
	// espd warns when it falls back (checked below with io_uring denied).
	journal := func() string {
		out, _ := c.run(nil, "journalctl", "--no-pager", "-o", "cat", "-u", name)
		return out
	}
	if n := strings.Count(journal(), uringFallback); n != 0 {
		t.Errorf("%s: espd wrote %q under the unit's SystemCallFilter=", name, uringFallback)
	}

	if !handoff {
		udpPortDropIn(t, c, top.GwA, name)
	}

	c.must(t, "systemctl", "stop", name)
	if p := c.show(t, name, "ActiveState", "Result", "ExecMainStatus"); p["ActiveState"] != "inactive" || p["Result"] != "success" || p["ExecMainStatus"] != "0" {
		t.Errorf("after systemctl stop: %v, want inactive, success, status 0", p)
	}

	// DevicePolicy=closed is in force: without the unit's DeviceAllow= espd
	// cannot open /dev/net/tun, and says what is missing.
	dropIn := "/etc/systemd/system/" + name + ".d/no-tun.conf"
	c.must(t, "mkdir", "-p", path.Dir(dropIn))
	if out, err := c.run([]byte("[Service]\nDeviceAllow=\n"), "tee", dropIn); err != nil {
		t.Fatalf("writing %s: %v\n%s", dropIn, err, out)
	}
	c.must(t, "systemctl", "daemon-reload")
	if out, err := c.run(nil, "systemctl", "start", name); err == nil {
		t.Fatalf("%s started without DeviceAllow=/dev/net/tun: DevicePolicy=closed is not in force\n%s", name, out)
	}
	out, _ := c.run(nil, "journalctl", "--no-pager", "-o", "cat", "-u", name)
	if want := "espd: data plane: tun: create esp0: operation not permitted (opening /dev/net/tun is denied by a device cgroup"; !strings.Contains(out, want) {
		t.Errorf("%s without DeviceAllow=: no %q in its journal:\n%s", name, want, testbed.Tail(out, 10))
	}
	c.must(t, "rm", dropIn)
	// The failed start counts against the unit's start limit (systemd 257
	// refuses the next start as "repeated too quickly" after the test's
	// five starts in a few seconds); forget it, as an administrator would.
	c.must(t, "systemctl", "reset-failed", name)

	// With io_uring_setup taken out of the filter, espd still carries the
	// tunnel, through writev(2), and says why.
	before := strings.Count(journal(), uringFallback)
	if out, err := c.run([]byte("[Service]\nSystemCallFilter=~io_uring_setup\n"), "tee", dropIn); err != nil {
		t.Fatalf("writing %s: %v\n%s", dropIn, err, out)
	}
	c.must(t, "systemctl", "daemon-reload")
	c.must(t, "systemctl", "start", name)
	if n := strings.Count(journal(), uringFallback) - before; n != 1 {
		t.Errorf("%s with io_uring_setup denied: %d %q lines, want 1:\n%s", name, n, uringFallback, testbed.Tail(journal(), 10))
	}
	if r, err := top.Client.Ping(ctx, testbed.ServerV4.Addr(), testbed.PingOptions{Count: 3}); err != nil || !r.OK() {
		t.Errorf("ping through the tunnel with io_uring denied: %v\n%s", err, r.Output)
	}
	c.must(t, "systemctl", "stop", name)
	c.must(t, "rm", dropIn)
	c.must(t, "systemctl", "daemon-reload")
}

// uringFallback begins the warning espd logs when the TUN writer cannot
// have its io_uring (dataplane.Device.Start).
const uringFallback = "TUN writes without io_uring"

// udpPortDropIn applies docs/strongswan.md's drop-in for espd.service
// without the IKE hand-off, as written, and expects espd on UDP port 4501
// and not 4500, which charon's socket-default then owns; it removes the
// drop-in and restarts the unit as it was.
func udpPortDropIn(t *testing.T, c *container, gw *testbed.Node, name string) {
	t.Helper()
	body := markedBlock(t, "../docs/strongswan.md", "ini", "espd.service udp-port drop-in")
	dropIn := "/etc/systemd/system/" + name + ".d/udp-port.conf"
	c.must(t, "mkdir", "-p", path.Dir(dropIn))
	if out, err := c.run([]byte(body), "tee", dropIn); err != nil {
		t.Fatalf("writing %s: %v\n%s", dropIn, err, out)
	}
	c.must(t, "systemctl", "daemon-reload")
	c.must(t, "systemctl", "restart", name)
	ports := func() string {
		out, err := gw.Run(context.Background(), "cat", "/proc/net/udp", "/proc/net/udp6")
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	// Ports in /proc/net/udp are hex: 4501 is 1195, 4500 is 1194.
	if !testbed.Poll(5*time.Second, 100*time.Millisecond, func() bool { return strings.Contains(ports(), ":1195 ") }) {
		t.Errorf("%s with docs/strongswan.md's drop-in: nothing on UDP 4501:\n%s", name, ports())
	} else if strings.Contains(ports(), ":1194 ") {
		t.Errorf("%s with docs/strongswan.md's drop-in still holds UDP 4500:\n%s", name, ports())
	}
	c.must(t, "rm", dropIn)
	c.must(t, "systemctl", "daemon-reload")
	c.must(t, "systemctl", "restart", name)
}
