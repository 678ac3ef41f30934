package packaging

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/espd/espd/control"
	"github.com/espd/espd/daemon"
	"github.com/espd/espd/testbed"
	"github.com/espd/espd/tun"

	"golang.org/x/sys/unix"
)

// Paths of the binaries TestMain builds.
var espdBin, espctlBin string

// TestMain builds ./cmd/espd and ./cmd/espctl into a temporary directory
// that the unprivileged user of TestServiceAsUnit can reach.
func TestMain(m *testing.M) {
	os.Exit(testbed.EspdMain(m, "packaging", &espdBin, &espctlBin))
}

// The unprivileged user TestServiceAsUnit runs espd as (nobody, nogroup):
// the units' User=espd is created by the package, which the test does not
// install.
const (
	serviceUID = 65534
	serviceGID = 65534
)

// service is espd started in a gateway as a unit starts it.
type service struct {
	node   *testbed.Node
	root   string // stands for /: holds run/espd, var/lib/espd, etc/espd
	sock   string // the control socket, root+control.DefaultSocketPath
	proc   *testbed.Process
	notify *net.UnixConn // the NOTIFY_SOCKET espd sends to
}

// serviceRoot makes a directory that stands for / on a gateway, as systemd
// and the package would leave it for the unit: run/espd (RuntimeDirectory,
// 0755) and var/lib/espd (StateDirectory, 0700) owned by the service user,
// etc/espd with config (the configuration file) and keys (name to hex key),
// root:group 0640 as the unit's comment asks.
func serviceRoot(t *testing.T, config string, keys map[string]string) string {
	t.Helper()
	root, err := os.MkdirTemp("", "espd-unit-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	mk := func(path string, mode os.FileMode, uid, gid int) {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	write := func(path, content string) {
		p := filepath.Join(root, path)
		if err := os.WriteFile(p, []byte(content), 0o640); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, 0, serviceGID); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"run", "var", "var/lib", "etc"} {
		mk(d, 0o755, 0, 0)
	}
	mk(filepath.Dir(control.DefaultSocketPath), 0o755, serviceUID, serviceGID)
	mk(daemon.DefaultStateDir, 0o700, serviceUID, serviceGID)
	mk(filepath.Dir(configPath), 0o750, 0, serviceGID)
	write(configPath, config)
	for name, key := range keys {
		write(filepath.Join(filepath.Dir(configPath), name), key+"\n")
	}
	return root
}

// unitArgv returns the command line that starts espd as u's ExecStart does,
// in root: the built espd for /usr/sbin/espd, the paths below / moved
// below root, and, since the socket and state directory are espd's
// defaults in the unit (TestUnitsMatchEspd), those defaults moved below
// root too.
func unitArgv(t *testing.T, u *unitFile, root string) []string {
	t.Helper()
	argv := u.execStart(t)
	out := []string{espdBin}
	for _, a := range argv[1:] {
		if strings.HasPrefix(a, "/") {
			a = filepath.Join(root, a)
		}
		out = append(out, a)
	}
	return append(out,
		"--socket", filepath.Join(root, control.DefaultSocketPath),
		"--state-dir", filepath.Join(root, daemon.DefaultStateDir))
}

// setprivArgs returns the setpriv command that runs the rest of a command
// line as the service user with exactly caps (CAP_NET_ADMIN, ...) as its
// ambient, inheritable, permitted and effective capabilities and its
// bounding set, and no_new_privs, as systemd does for User=,
// AmbientCapabilities=, CapabilityBoundingSet= and NoNewPrivileges=.
func setprivArgs(caps []string) []string {
	var names []string
	for _, c := range caps {
		names = append(names, "+"+strings.ToLower(strings.TrimPrefix(c, "CAP_")))
	}
	set := strings.Join(append([]string{"-all"}, names...), ",")
	return []string{"setpriv",
		"--reuid", strconv.Itoa(serviceUID), "--regid", strconv.Itoa(serviceGID), "--clear-groups",
		"--inh-caps", set, "--ambient-caps", set, "--bounding-set", set,
		"--no-new-privs", "--"}
}

// limitArgs returns the prlimit command that applies u's LimitMEMLOCK=
// (soft and hard, as systemd sets it) to the rest of the command line, or
// nothing if u has none.
func limitArgs(t *testing.T, u *unitFile) []string {
	t.Helper()
	v := u.values("Service", "LimitMEMLOCK")
	if len(v) == 0 {
		return nil
	}
	n, err := systemdSize(v[len(v)-1])
	if err != nil {
		t.Fatalf("%s: LimitMEMLOCK=%s: %v", u.name, v[len(v)-1], err)
	}
	// Without CAP_SYS_RESOURCE (as in a container) the test cannot raise
	// the hard limit as systemd would; it applies as much as it may.
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl); err == nil && n > rl.Max {
		t.Logf("%s: LimitMEMLOCK=%s above this process's hard limit, %d bytes: applying that", u.name, v[len(v)-1], rl.Max)
		n = rl.Max
	}
	return []string{"prlimit", "--memlock=" + strconv.FormatUint(n, 10), "--"}
}

// systemdSize parses a size as systemd does: bytes, or K, M, G (base 1024).
func systemdSize(s string) (uint64, error) {
	mult := uint64(1)
	if i := strings.IndexAny(s, "KMG"); i == len(s)-1 && i > 0 {
		mult = map[byte]uint64{'K': 1 << 10, 'M': 1 << 20, 'G': 1 << 30}[s[i]]
		s = s[:i]
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return n * mult, err
}

// devTUN returns a command prefix that gives the rest of the command line
// a /dev/net/tun that everyone may open (mode 0666), as udev makes it on a
// system that runs systemd (50-udev-default.rules); a machine without udev
// (a container, CI) may have it 0600, which only root can open. The node
// is made on a tmpfs over /dev/net in the mount namespace of the command
// (ip netns exec runs each command in a mount namespace of its own), so
// the machine's /dev stays as it is.
func devTUN(t *testing.T) []string {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat("/dev/net/tun", &st); err != nil {
		t.Skipf("no /dev/net/tun: %v", err)
	}
	script := fmt.Sprintf(`mount -t tmpfs -o mode=0755 tmpfs /dev/net && mknod -m 0666 /dev/net/tun c %d %d && exec "$@"`,
		unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev)))
	return []string{"sh", "-c", script, "devtun"}
}

// startService starts espd in node as u starts it, with caps instead of
// u's capabilities, and a NOTIFY_SOCKET of the test's in an environment of
// nothing else (as systemd's). It does not wait for readiness.
func startService(t *testing.T, node *testbed.Node, u *unitFile, root string, caps []string) *service {
	t.Helper()
	s := &service{node: node, root: root, sock: filepath.Join(root, control.DefaultSocketPath)}
	path := filepath.Join(root, "notify")
	var err error
	s.notify, err = net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.notify.Close() })
	if err := os.Chmod(path, 0o666); err != nil { // sendto needs write permission
		t.Fatal(err)
	}
	argv := append(append(append(append(devTUN(t), "env", "-i", "NOTIFY_SOCKET="+path), limitArgs(t, u)...), setprivArgs(caps)...), unitArgv(t, u, root)...)
	s.proc, err = node.Start(filepath.Join(root, "espd.log"), argv...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.proc.Stop(10 * time.Second)
		if t.Failed() {
			t.Logf("espd on %s (%s) logged:\n%s", node.Role, strings.Join(argv, " "), testbed.Tail(s.proc.Log(), 60))
		}
	})
	return s
}

// missingCapError is what espd's error says it could not do without each
// capability.
var missingCapError = map[string]string{
	"CAP_NET_ADMIN":        "tun: create esp0: operation not permitted (needs CAP_NET_ADMIN)",
	"CAP_NET_RAW":          "raw ESP socket: operation not permitted (needs CAP_NET_RAW)",
	"CAP_NET_BIND_SERVICE": "bind IPv4 UDP port 500 (IKE): permission denied (needs CAP_NET_BIND_SERVICE for a port below 1024)",
}

// errExited is returned by next when espd exits first.
var errExited = errors.New("espd exited")

// next returns the next notification espd sent, within d. It returns
// errExited once espd has exited and sent nothing more.
func (s *service) next(d time.Duration) (string, error) {
	deadline := time.Now().Add(d)
	buf := make([]byte, 4096)
	for time.Now().Before(deadline) {
		s.notify.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, err := s.notify.Read(buf)
		if err == nil {
			return string(buf[:n]), nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return "", err
		}
		if done, _ := s.proc.Exited(); done {
			return "", errExited
		}
	}
	return "", fmt.Errorf("no notification within %v", d)
}

// expect requires the next notification to start with want ("READY=1", ...)
// and returns it.
func (s *service) expect(t *testing.T, want string) string {
	t.Helper()
	got, err := s.next(20 * time.Second)
	if err != nil {
		t.Fatalf("espd on %s: waiting for %s: %v\n%s", s.node.Role, want, err, testbed.Tail(s.proc.Log(), 30))
	}
	if !strings.HasPrefix(got, want) {
		t.Fatalf("espd on %s: notification %q, want %s", s.node.Role, got, want)
	}
	return got
}

// checkReady checks, when espd has sent READY=1, that it takes states: its
// control socket answers espctl as root, its TUN is up, and with the
// hand-off UDP port 500 is bound in the gateway.
func (s *service) checkReady(t *testing.T, handoff bool) {
	t.Helper()
	if out, err := testbed.Espctl(nil, espctlBin, s.sock, "sa", "list"); err != nil {
		t.Fatalf("espd on %s sent READY=1, but espctl sa list: %v\n%s", s.node.Role, err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	link, err := s.node.IP(ctx, "link", "show", "dev", tun.DefaultName)
	if err != nil || !strings.Contains(link, ",UP") {
		t.Fatalf("espd on %s sent READY=1, but its TUN: %v\n%s", s.node.Role, err, link)
	}
	if handoff {
		out, err := s.node.Run(ctx, "cat", "/proc/net/udp")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, ":01F4 ") {
			t.Fatalf("espd on %s sent READY=1 with the hand-off, but nothing listens on UDP port 500:\n%s", s.node.Role, out)
		}
	}
}

// gatewayConfig returns a gateway's configuration file of a
// chacha20poly1305 tunnel between the LANs (as docs/config.md's example),
// with its key files out.key and in.key.
func gatewayConfig(local, remote, lanLocal, lanRemote string) string {
	sa := func(spi, dir, src, dst, key string) string {
		return fmt.Sprintf("[[sa]]\nspi = %s\ndir = %q\nsrc = %q\ndst = %q\nsuite = \"chacha20poly1305\"\nenc_key_file = %q\nreqid = 1\n\n", spi, dir, src, dst, key)
	}
	pol := func(src, dst, dir string) string {
		return fmt.Sprintf("[[policy]]\nsrc = %q\ndst = %q\ndir = %q\nreqid = 1\n\n", src, dst, dir)
	}
	outSPI, inSPI := "0x1001", "0x2001"
	if local > remote {
		outSPI, inSPI = inSPI, outSPI
	}
	return sa(outSPI, "out", local, remote, "out.key") + sa(inSPI, "in", remote, local, "in.key") +
		pol(lanLocal, lanRemote, "out") + pol(lanRemote, lanLocal, "in")
}

func hexKey(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// TestServiceAsUnit starts espd on two gateways the way each unit starts it
// (ExecStart's flags; as an unprivileged user with exactly the unit's
// capabilities as ambient capabilities and bounding set, no_new_privs; the
// runtime and state directories systemd makes; a configuration file and
// key files readable by the service's group only), waits for READY=1 on a
// NOTIFY_SOCKET and checks that espd is then ready, runs traffic through
// the tunnel of the configuration file, reloads it with the unit's
// ExecReload (RELOADING=1 then READY=1) and stops it with SIGTERM
// (STOPPING=1, exit status 0). Then it starts espd with each one of the
// unit's capabilities left out, and requires it to fail at start with an
// error that says what it could not do.
func TestServiceAsUnit(t *testing.T) {
	for _, tool := range []string{"setpriv", "ping", "env"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	for _, name := range []string{plainUnit, handoffUnit} {
		t.Run(name, func(t *testing.T) {
			u := loadUnit(t, name)
			caps := u.caps(t)
			handoff := slices.Contains(u.execStart(t), handoffFlag)
			top := testbed.NewT(t, testbed.Options{Prefix: "unit"})
			ab, ba := hexKey(t, 36), hexKey(t, 36)
			a := startService(t, top.GwA, u, serviceRoot(t,
				gatewayConfig(testbed.GwATransitV4.Addr().String(), testbed.GwBTransitV4.Addr().String(), testbed.LANAV4.String(), testbed.LANBV4.String()),
				map[string]string{"out.key": ab, "in.key": ba}), caps)
			b := startService(t, top.GwB, u, serviceRoot(t,
				gatewayConfig(testbed.GwBTransitV4.Addr().String(), testbed.GwATransitV4.Addr().String(), testbed.LANBV4.String(), testbed.LANAV4.String()),
				map[string]string{"out.key": ba, "in.key": ab}), caps)
			for _, s := range []*service{a, b} {
				s.expect(t, "READY=1")
				s.checkReady(t, handoff)
			}

			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			r, err := top.Client.Ping(ctx, testbed.ServerV4.Addr(), testbed.PingOptions{Count: 3})
			if err != nil || !r.OK() {
				t.Fatalf("ping through the tunnel: %v\n%s", err, r.Output)
			}
			tr, err := testbed.Transfer(ctx, testbed.TransferOptions{From: top.Client, To: top.Server,
				Dst: testbed.ServerV4.Addr(), Bytes: 4 << 20, Timeout: time.Minute, Seed: 12})
			if err != nil {
				t.Fatalf("transfer through the tunnel: %v (%v)", err, tr)
			}
			out, err := testbed.Espctl(nil, espctlBin, a.sock, "sa", "list")
			if err != nil || !strings.Contains(out, "chacha20poly1305") {
				t.Fatalf("espctl sa list on gwA: %v\n%s", err, out)
			}

			// ExecReload, as systemd runs it (the process is espd itself:
			// ip netns exec, env and setpriv exec it).
			reload := u.words(t, "Service", "ExecReload", "$MAINPID")
			for i, w := range reload {
				if w == "$MAINPID" {
					reload[i] = strconv.Itoa(a.proc.Pid())
				}
			}
			if out, err := exec.Command(reload[0], reload[1:]...).CombinedOutput(); err != nil {
				t.Fatalf("ExecReload %q: %v\n%s", reload, err, out)
			}
			msg := a.expect(t, "RELOADING=1")
			if !strings.Contains(msg, "\nMONOTONIC_USEC=") {
				t.Errorf("reloading notification %q without MONOTONIC_USEC", msg)
			}
			a.expect(t, "READY=1")
			if !testbed.Poll(5*time.Second, 50*time.Millisecond, func() bool {
				return testbed.CountLines(a.proc.Log(), "configuration reloaded", "states=2", "policies=2") > 0
			}) {
				t.Errorf("no \"configuration reloaded\" line after ExecReload")
			}
			if r, err := top.Client.Ping(ctx, testbed.ServerV4.Addr(), testbed.PingOptions{Count: 3}); err != nil || !r.OK() {
				t.Fatalf("ping through the tunnel after the reload: %v\n%s", err, r.Output)
			}

			for _, s := range []*service{a, b} {
				if err := s.proc.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
				s.expect(t, "STOPPING=1")
				select {
				case <-s.proc.Done():
				case <-time.After(10 * time.Second):
					t.Fatalf("espd on %s did not exit within 10 s of SIGTERM", s.node.Role)
				}
				if code, _ := s.proc.ExitCode(); code != 0 {
					t.Fatalf("espd on %s exited with status %d after SIGTERM:\n%s", s.node.Role, code, testbed.Tail(s.proc.Log(), 20))
				}
			}

			// Each capability is needed: without it espd fails at start
			// and says what it could not do.
			for _, c := range caps {
				t.Run("without "+c, func(t *testing.T) {
					s := startService(t, top.GwA, u, serviceRoot(t, "", nil), slices.DeleteFunc(slices.Clone(caps), func(x string) bool { return x == c }))
					if msg, err := s.next(20 * time.Second); !errors.Is(err, errExited) {
						t.Fatalf("espd without %s: notification %q (%v), want an exit at start", c, msg, err)
					}
					code, _ := s.proc.ExitCode()
					lines := strings.Split(strings.TrimSpace(s.proc.Log()), "\n")
					last := lines[len(lines)-1]
					if code != 1 || !strings.HasPrefix(last, "espd: ") || !strings.Contains(last, missingCapError[c]) {
						t.Fatalf("espd without %s: exit status %d, last line %q; want status 1 and an error with %q", c, code, last, missingCapError[c])
					}
					t.Logf("without %s: %s", c, last)
				})
			}
		})
	}
}
