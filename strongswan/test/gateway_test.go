package strongswantest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// tunName is the TUN device of every espd here.
const tunName = "esp0"

// gateway is one IKE gateway in a namespace: espd and charon with the espd
// plugin, or charon alone with strongSwan's kernel-libipsec.
type gateway struct {
	t    *testing.T
	name string
	node *testbed.Node
	dir  string
	sock string // espd's control socket
	vici string // charon's vici socket

	espd      *testbed.Process
	espdArgs  []string
	noHandoff bool // espd without --ike-handoff, charon with socket-default
	// slowStop: charon is stopped before espd at clean-up and may outlast
	// SIGTERM (a pair node with the ha plugin's secret: docs/ha.md); that
	// is logged only.
	slowStop bool
	espdRuns int
	charon   *testbed.Process
}

// newGateway prepares a gateway on node; nothing runs yet.
func newGateway(t *testing.T, node *testbed.Node, name string) *gateway {
	t.Helper()
	dir, err := os.MkdirTemp("", "sst-"+name+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	g := &gateway{t: t, name: name, node: node, dir: dir,
		sock: filepath.Join(dir, "espd.sock"), vici: filepath.Join(dir, "charon.vici")}
	// swanctl's own configuration: no plugin noise from the system's.
	conf := "swanctl {\n  load = pem pkcs1 x509 pubkey openssl random nonce revocation constraints\n}\n"
	if err := os.WriteFile(filepath.Join(dir, "swanctl-strongswan.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	return g
}

// startEspd starts espd with the IKE hand-off (unless g.noHandoff: then
// charon keeps UDP 500/4500 and espd's ESP-in-UDP port is 4501) and extra
// flags, and waits until its socket answers and its TUN exists.
func (g *gateway) startEspd(extra ...string) {
	g.t.Helper()
	// The state directory is the gateway's: it survives espd's restarts.
	g.espdArgs = []string{espdBin, "--tun", tunName, "--socket", g.sock, "--workers", "2",
		"--state-dir", filepath.Join(g.dir, "state"), "--log-format", "text", "--log-level", "debug"}
	if g.noHandoff {
		g.espdArgs = append(g.espdArgs, "--udp-port", "4501")
	} else {
		g.espdArgs = append(g.espdArgs, "--udp-port", "4500", "--ike-handoff")
	}
	g.espdArgs = append(g.espdArgs, extra...)
	g.runEspd()
}

// runEspd starts espd with the arguments of startEspd (again after a kill).
func (g *gateway) runEspd() {
	g.t.Helper()
	g.espdRuns++
	p, err := g.node.Start(filepath.Join(g.dir, fmt.Sprintf("espd-%d.log", g.espdRuns)), g.espdArgs...)
	if err != nil {
		g.t.Fatal(err)
	}
	g.espd = p
	g.t.Cleanup(func() {
		if g.t.Failed() {
			g.t.Logf("espd on %s (run %d) logged:\n%s", g.name, g.espdRuns, tail(p.Log(), 80))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := testbed.WaitEspd(ctx, g.node, p, g.sock, tunName); err != nil {
		g.t.Fatalf("espd on %s: %v\n%s", g.name, err, tail(p.Log(), 40))
	}
}

// killEspd kills espd with SIGKILL and waits for it to be gone.
func (g *gateway) killEspd() {
	g.t.Helper()
	if err := g.espd.Signal(syscall.SIGKILL); err != nil {
		g.t.Fatal(err)
	}
	select {
	case <-g.espd.Done():
	case <-time.After(10 * time.Second):
		g.t.Fatalf("espd on %s survived SIGKILL", g.name)
	}
	g.espd.Stop(time.Second) // marks it stopped; its exit status is the kill
}

// charonOptions shape a gateway's strongswan.conf.
type charonOptions struct {
	// Libipsec runs strongSwan's userspace ESP (kernel-libipsec, always
	// UDP-encapsulated) instead of the espd plugin.
	Libipsec bool
	// NoHandoff keeps socket-default (charon owns UDP 500/4500): raw ESP
	// only.
	NoHandoff bool
	// Log adds filelog levels, e.g. "chd = 4".
	Log string
	// DebianTimers keeps charon's default retransmit settings (4 s, base
	// 1.8, 5 tries, as Debian ships them) instead of the tests' shorter
	// ones.
	DebianTimers bool
	// Plugins are loaded too (after vici, before the kernel plugins), e.g.
	// "resolve".
	Plugins string
	// Extra is appended to strongswan.conf as written (sections repeated
	// there merge with the ones above).
	Extra string
}

// charonConf returns the gateway's strongswan.conf.
func (g *gateway) charonConf(o charonOptions) string {
	var b strings.Builder
	crypto := "random nonce openssl aes sha1 sha2 hmac gcm kdf pem pkcs1 x509 pubkey revocation constraints vici"
	if o.Plugins != "" {
		crypto += " " + o.Plugins
	}
	fmt.Fprintf(&b, "charon {\n")
	switch {
	case o.Libipsec:
		// kernel-libipsec before kernel-netlink takes the IPsec role; it
		// routes through its TUN with charon's routes.
		fmt.Fprintf(&b, "  load = %s kernel-libipsec kernel-netlink socket-default\n", crypto)
	case o.NoHandoff:
		fmt.Fprintf(&b, "  load = %s espd kernel-netlink socket-default\n", crypto)
		fmt.Fprintf(&b, "  install_routes = no\n")
	default:
		fmt.Fprintf(&b, "  load = %s espd kernel-netlink\n", crypto)
		fmt.Fprintf(&b, "  install_routes = no\n")
	}
	if !o.DebianTimers {
		fmt.Fprintf(&b, "  retransmit_timeout = 1.0\n  retransmit_base = 1.4\n  retransmit_tries = 4\n")
	}
	fmt.Fprintf(&b, "  filelog {\n    stderr {\n      time_format = %%T\n      default = 1\n      knl = 2\n      %s\n    }\n  }\n", o.Log)
	fmt.Fprintf(&b, "  plugins {\n    vici {\n      socket = unix://%s\n    }\n", g.vici)
	if !o.Libipsec {
		fmt.Fprintf(&b, "    espd {\n      socket = %s\n      timeout = 3000\n      ike_handoff = %v\n    }\n",
			g.sock, map[bool]string{true: "no", false: "yes"}[o.NoHandoff])
	}
	fmt.Fprintf(&b, "  }\n}\n")
	b.WriteString(o.Extra)
	return b.String()
}

// startCharon starts charon in the gateway's namespace, in a mount
// namespace of its own with a private /run, and waits for its vici socket.
func (g *gateway) startCharon(o charonOptions) {
	g.t.Helper()
	conf := filepath.Join(g.dir, "strongswan.conf")
	if err := os.WriteFile(conf, []byte(g.charonConf(o)), 0o644); err != nil {
		g.t.Fatal(err)
	}
	env := "STRONGSWAN_CONF=" + conf
	if p := os.Getenv(pluginEnv); p != "" {
		// charon finds the preloaded plugin's constructor first.
		env += " LD_PRELOAD=" + p
	}
	script := fmt.Sprintf("mount -t tmpfs tmpfs /run && exec env %s %s", env, charonBin)
	p, err := g.node.Start(filepath.Join(g.dir, "charon.log"),
		"unshare", "-m", "--propagation", "private", "sh", "-c", script)
	if err != nil {
		g.t.Fatal(err)
	}
	g.charon = p
	g.t.Cleanup(func() {
		if g.t.Failed() {
			g.t.Logf("charon on %s logged:\n%s", g.name, tail(p.Log(), 150))
		}
	})
	if g.slowStop {
		// A pair node's charon is stopped first (clean-ups run last-in
		// first-out), while espd and the gateway's directory are still
		// there; with the ha plugin's secret it outlasts SIGTERM
		// (docs/ha.md, "Restarts"), which is logged, not failed.
		g.t.Cleanup(func() {
			if err := p.Stop(5 * time.Second); err != nil {
				g.t.Logf("charon on %s (known: docs/ha.md, \"Restarts\"): %v", g.name, err)
			}
		})
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		if done, err := p.Exited(); done {
			g.t.Fatalf("charon on %s exited during start: %v\n%s", g.name, err, tail(p.Log(), 40))
		}
		if _, err := g.swanctl("--stats"); err == nil {
			return
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("charon on %s: vici socket %s not ready\n%s", g.name, g.vici, tail(p.Log(), 40))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// swanctl runs swanctl against the gateway's charon.
func (g *gateway) swanctl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	args = append(args, "--uri", "unix://"+g.vici)
	cmd := exec.CommandContext(ctx, "swanctl", args...)
	cmd.Env = append(os.Environ(), "STRONGSWAN_CONF="+filepath.Join(g.dir, "swanctl-strongswan.conf"))
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("swanctl %s on %s: %w\n%s", strings.Join(args, " "), g.name, err, out)
	}
	return string(out), nil
}

// mustSwanctl is swanctl that fails the test on error.
func (g *gateway) mustSwanctl(args ...string) string {
	g.t.Helper()
	out, err := g.swanctl(args...)
	if err != nil {
		g.t.Fatal(err)
	}
	return out
}

// load replaces the gateway's connections and secrets with conf.
func (g *gateway) load(conf string) {
	g.t.Helper()
	path := filepath.Join(g.dir, "swanctl.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		g.t.Fatal(err)
	}
	g.mustSwanctl("--load-all", "--clear", "--noprompt", "--file", path)
}

// espctl runs espctl against the gateway's espd.
func (g *gateway) espctl(args ...string) (string, error) {
	out, err := testbed.Espctl(nil, espctlBin, g.sock, args...)
	if err != nil {
		return out, fmt.Errorf("espctl %s on %s: %w\n%s", strings.Join(args, " "), g.name, err, out)
	}
	return out, nil
}

func (g *gateway) mustEspctl(args ...string) string {
	g.t.Helper()
	out, err := g.espctl(args...)
	if err != nil {
		g.t.Fatal(err)
	}
	return out
}

// espdSPIs returns the SPIs of espd's states, by direction ("in", "out").
func (g *gateway) espdSPIs() map[string][]string {
	g.t.Helper()
	out := g.mustEspctl("sa", "list")
	spis := map[string][]string{}
	for _, m := range regexp.MustCompile(`(?m)^spi 0x([0-9a-f]{8}) dir (in|out) state (\S+)`).FindAllStringSubmatch(out, -1) {
		if m[3] == "larval" {
			continue
		}
		spis[m[2]] = append(spis[m[2]], m[1])
	}
	return spis
}

// espdPolicies returns how many policies espd has.
func (g *gateway) espdPolicies() int {
	g.t.Helper()
	out := g.mustEspctl("policy", "list")
	return len(regexp.MustCompile(`(?m)^\s+dir (in|out|fwd) `).FindAllString(out, -1))
}

// espdPoliciesKept returns how many of espd's policies are outbound drop
// policies, as the plugin keeps them for a loaded connection whose
// CHILD_SA went.
func (g *gateway) espdPoliciesKept() int {
	g.t.Helper()
	out := g.mustEspctl("policy", "list")
	return len(regexp.MustCompile(`(?m)^\s+dir out action drop `).FindAllString(out, -1))
}

// tunnelRoutes returns espd's routes into the TUN.
func (g *gateway) tunnelRoutes() string {
	g.t.Helper()
	out, err := g.node.IP(context.Background(), "route", "show", "table", "all", "dev", tunName, "proto", "229")
	if err != nil {
		g.t.Fatal(err)
	}
	v6, err := g.node.IP(context.Background(), "-6", "route", "show", "table", "all", "dev", tunName, "proto", "229")
	if err != nil {
		g.t.Fatal(err)
	}
	return strings.TrimSpace(out + v6)
}

// childSA is one CHILD_SA as swanctl --list-sas --raw shows it.
type childSA struct {
	Name, State           string
	Mode                  string // TUNNEL, TRANSPORT
	ReqID                 int
	SPIIn, SPIOut         string
	Encap                 bool
	BytesIn, BytesOut     uint64
	PacketsIn, PacketsOut uint64
}

var (
	childRE = regexp.MustCompile(`\{name=(\S+) uniqueid=\d+ reqid=(\d+) state=(\S+) ([^{}]*)\}`)
	kvRE    = regexp.MustCompile(`([a-z-]+)=(\S+)`)
)

// childSAs lists the CHILD_SAs charon has.
func (g *gateway) childSAs() []childSA {
	g.t.Helper()
	out := g.mustSwanctl("--list-sas", "--raw")
	var list []childSA
	for _, m := range childRE.FindAllStringSubmatch(out, -1) {
		c := childSA{Name: m[1], State: m[3]}
		c.ReqID, _ = strconv.Atoi(m[2])
		for _, kv := range kvRE.FindAllStringSubmatch(m[4], -1) {
			n, _ := strconv.ParseUint(kv[2], 10, 64)
			switch kv[1] {
			case "spi-in":
				c.SPIIn = kv[2]
			case "spi-out":
				c.SPIOut = kv[2]
			case "mode":
				c.Mode = kv[2]
			case "encap":
				c.Encap = kv[2] == "yes"
			case "bytes-in":
				c.BytesIn = n
			case "bytes-out":
				c.BytesOut = n
			case "packets-in":
				c.PacketsIn = n
			case "packets-out":
				c.PacketsOut = n
			}
		}
		list = append(list, c)
	}
	return list
}

// installedChild returns the installed CHILD_SA named name, or false.
func (g *gateway) installedChild(name string) (childSA, bool) {
	for _, c := range g.childSAs() {
		if c.Name == name && c.State == "INSTALLED" {
			return c, true
		}
	}
	return childSA{}, false
}

// waitChild waits until the CHILD_SA is installed, or fails the test.
func (g *gateway) waitChild(name string, timeout time.Duration) childSA {
	g.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if c, ok := g.installedChild(name); ok {
			return c
		}
		if time.Now().After(deadline) {
			g.t.Fatalf("%s: CHILD_SA %s not installed within %v:\n%s", g.name, name, timeout,
				g.mustSwanctl("--list-sas"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// charonLogCount counts charon's log lines containing all of subs.
func (g *gateway) charonLogCount(subs ...string) int {
	return testbed.CountLines(g.charon.Log(), subs...)
}

// tail returns the last n lines of s.
func tail(s string, n int) string { return testbed.Tail(s, n) }

// waitFor polls cond every 100 ms until it holds or timeout passes.
func waitFor(timeout time.Duration, cond func() bool) bool {
	return testbed.Poll(timeout, 100*time.Millisecond, cond)
}
