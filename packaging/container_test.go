package packaging

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// container is a Debian system booted by systemd-nspawn, systemd as its
// PID 1, in a test bed namespace.
type container struct {
	cmd    *exec.Cmd
	out    *bytes.Buffer // systemd-nspawn's own output
	leader int           // the container's PID 1, as the machine sees it
	done   chan struct{} // closed when systemd-nspawn has exited
}

// bootContainer boots rootfs with systemd-nspawn in node's network
// namespace, read-only with a tmpfs overlay (nothing it writes reaches
// rootfs), with the directory debs bound read-only on /mnt/espd, and waits
// until systemd has finished booting. There is no systemd-machined here, so
// the container is neither registered nor given a scope of its own
// (--register=no --keep-unit); systemd-nspawn gives it its own
// /dev/net/tun node (as the machine's, 0600: the machine has no udev).
// CAP_NET_ADMIN stays in the container's capabilities, as in a container
// with --private-network.
func bootContainer(t *testing.T, rootfs, debs string, node *testbed.Node) *container {
	t.Helper()
	return boot(t, rootfs, true, debs, node)
}

// persistentRoot returns a root file system for boot(volatile=false) that
// keeps what the containers booted from it write, from one boot to the
// next, until the test ends: an overlay mount with rootfs below and a
// directory of the test above (rootfs itself is never written).
func persistentRoot(t *testing.T, rootfs string) string {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	for _, d := range []string{"upper", "work", "root"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", rootfs, filepath.Join(dir, "upper"), filepath.Join(dir, "work"))
	if err := syscall.Mount("overlay", root, "overlay", 0, opts); err != nil {
		t.Fatalf("overlay mount of %s on %s: %v", rootfs, root, err)
	}
	t.Cleanup(func() {
		// After the containers' cleanups (registered later, run first).
		if err := syscall.Unmount(root, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", root, err)
		}
	})
	return root
}

// boot boots the root file system dir as bootContainer says; with volatile
// false it boots dir as it is, writable (persistentRoot), so that a later
// boot of dir finds what this one wrote.
func boot(t *testing.T, dir string, volatile bool, debs string, node *testbed.Node) *container {
	t.Helper()
	c := &container{out: new(bytes.Buffer), done: make(chan struct{})}
	args := []string{"--quiet", "--register=no", "--keep-unit", "--directory=" + dir}
	if volatile {
		args = append(args, "--volatile=overlay")
	}
	c.cmd = exec.Command("systemd-nspawn", append(args,
		// A name of its own: systemd-nspawn keeps per-name state under
		// /run/systemd/nspawn that the previous container may still be
		// removing.
		fmt.Sprintf("--machine=espd-test-%d", containers.Add(1)),
		"--network-namespace-path="+filepath.Join(testbed.NetnsDir, node.Name),
		// The container's own network namespace (--private-network) would
		// keep CAP_NET_ADMIN in its bounding set; a given one does not.
		"--capability=CAP_NET_ADMIN",
		// bpf(2), which systemd-nspawn's seccomp filter denies by default:
		// the container's systemd enforces DevicePolicy= and DeviceAllow=
		// with a BPF device program on its cgroup v2 hierarchy.
		"--system-call-filter=bpf",
		"--bind-ro="+debs+":/mnt/espd", "--console=pipe", "--boot")...)
	// A cgroup v2 hierarchy in the container even where the machine has
	// v1 or hybrid: with v1 systemd-nspawn mounts the devices controller
	// read-only and DevicePolicy= silently does nothing.
	// /proc/sys/net writable, as on a real box (the container has a network
	// namespace of its own; systemd-nspawn leaves all of /proc/sys read-only
	// otherwise): deploy.md's sysctl for forwarding, and espd's rp_filter
	// on its TUN under systemd 257, whose units' new /proc (ProtectProc=)
	// keeps the read-only /proc/sys that 252's did not.
	c.cmd.Env = append(os.Environ(), "SYSTEMD_NSPAWN_UNIFIED_HIERARCHY=1", "SYSTEMD_NSPAWN_API_VFS_WRITABLE=network")
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.cmd.Wait(); close(c.done) }()
	t.Cleanup(func() {
		if !c.exited() {
			c.poweroff(t)
		}
		if t.Failed() {
			t.Logf("systemd-nspawn:\n%s", testbed.Tail(c.out.String(), 40))
		}
	})
	// systemd-nspawn's first child sets up the namespaces and forks the
	// one that execs systemd; only that one is the container's PID 1.
	if !testbed.Poll(30*time.Second, 100*time.Millisecond, func() bool {
		c.leader = childOf(c.cmd.Process.Pid)
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", c.leader))
		return c.leader != 0 && strings.TrimSpace(string(comm)) == "systemd"
	}) {
		t.Fatalf("systemd-nspawn started no container within 30 s") // the cleanup logs its output
	}
	// systemctl fails until the container's systemd listens on its bus
	// (systemd 252: "Failed to connect to bus"; 257: "Failed to connect to
	// system scope bus"), and says "offline" until systemd has created
	// /run/systemd/system.
	var state string
	var err error
	testbed.Poll(60*time.Second, 200*time.Millisecond, func() bool {
		state, err = c.run(nil, "systemctl", "is-system-running", "--wait")
		state = strings.TrimSpace(state)
		return !strings.Contains(state, "Failed to connect to") && state != "offline"
	})
	if state != "running" {
		failed, _ := c.run(nil, "systemctl", "--failed", "--no-pager")
		units, _ := c.run(nil, "systemctl", "--failed", "--no-legend", "--plain")
		argv := []string{"journalctl", "-b", "--no-pager", "-n", "40"}
		for _, l := range strings.Split(units, "\n") {
			if f := strings.Fields(l); len(f) > 0 {
				argv = append(argv, "-u", f[0])
			}
		}
		journal, _ := c.run(nil, argv...)
		t.Fatalf("systemd in the container: %q (%v), want running\n%s\n%s", state, err, failed, journal)
	}
	return c
}

// exited reports whether systemd-nspawn has exited.
func (c *container) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// poweroff has the container's systemd power off (SIGTERM to
// systemd-nspawn: a clean shutdown) and waits until it has, at most 30 s,
// then kills it.
func (c *container) poweroff(t *testing.T) {
	t.Helper()
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		c.cmd.Process.Kill()
		<-c.done
		t.Errorf("the container did not power off within 30 s of SIGTERM")
	}
}

// powerCut kills the container's PID 1 with SIGKILL, which kills every
// process in the container at once (the end of its PID namespace): no unit
// stops, nothing is written on the way down. It waits until systemd-nspawn
// has exited.
func (c *container) powerCut(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(c.leader, syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL to the container's PID 1 (%d): %v", c.leader, err)
	}
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		c.cmd.Process.Kill()
		<-c.done
		t.Errorf("systemd-nspawn did not exit within 30 s of its container's PID 1 being killed")
	}
}

// childOf returns the PID of a child of pid, or 0.
func childOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(f[0])
	return n
}

// run runs argv in the container (all its namespaces, as root) with stdin
// and returns its combined output.
func (c *container) run(stdin []byte, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--target", strconv.Itoa(c.leader), "--all", "--"}, argv...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// must runs argv in the container and fails the test if it fails.
func (c *container) must(t *testing.T, argv ...string) string {
	t.Helper()
	out, err := c.run(nil, argv...)
	if err != nil {
		t.Fatalf("in the container: %q: %v\n%s", argv, err, out)
	}
	return out
}

// show returns the unit's properties (systemctl show -p).
func (c *container) show(t *testing.T, unit string, props ...string) map[string]string {
	t.Helper()
	argv := []string{"systemctl", "show", unit}
	for _, p := range props {
		argv = append(argv, "-p", p)
	}
	m := map[string]string{}
	for _, l := range strings.Split(c.must(t, argv...), "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			m[k] = v
		}
	}
	return m
}

// writeFile writes content to path in the container, root:espd 0640, as
// the unit's comment asks of the configuration and key files.
func (c *container) writeFile(t *testing.T, path, content string) {
	t.Helper()
	if out, err := c.run([]byte(content), "install", "-m", "0640", "-o", "root", "-g", "espd", "/dev/stdin", path); err != nil {
		t.Fatalf("writing %s in the container: %v\n%s", path, err, out)
	}
}
