package docs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// gateway is one gateway of TestDeploy: a network namespace of the
// testbed, and a process holding a mount namespace in which /etc, /run,
// /var/lib, /usr/bin and /usr/sbin are overlays over the machine's, with
// the binaries under test at espdPath and espctlPath.
type gateway struct {
	name    string
	node    *testbed.Node
	transit netip.Addr
	holder  *testbed.Process
	espd    *testbed.Process
	// espdUnit is the unit that started espd: espd or espd-ike.
	espdUnit string
	charon   *testbed.Process
	dir      string // the test's directory for this gateway (logs, overlay layers)
	started  int    // how many times espd was started
	stopped  int    // and stopped by "systemctl disable --now"
}

// newGateway makes gateway name on node, with its files under base, and
// starts the process that holds its mount namespace.
func newGateway(t *testing.T, base, name string, node *testbed.Node, transit netip.Addr, espd, espctl string) *gateway {
	t.Helper()
	g := &gateway{name: name, node: node, transit: transit, dir: filepath.Join(base, "gw"+name)}
	var mounts []string
	for _, d := range overlaid {
		layer := filepath.Join(g.dir, strings.ReplaceAll(strings.TrimPrefix(d, "/"), "/", "_"))
		for _, sub := range []string{"upper", "work"} {
			if err := os.MkdirAll(filepath.Join(layer, sub), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		mounts = append(mounts, fmt.Sprintf("mount -t overlay overlay -o lowerdir=%s,upperdir=%s/upper,workdir=%s/work %s", d, layer, layer, d))
	}
	for _, b := range []struct{ src, dst string }{{espd, espdPath}, {espctl, espctlPath}} {
		layer := filepath.Join(g.dir, strings.ReplaceAll(strings.TrimPrefix(filepath.Dir(b.dst), "/"), "/", "_"), "upper")
		if err := copyFile(b.src, filepath.Join(layer, filepath.Base(b.dst)), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ready := filepath.Join(g.dir, "ready")
	// /dev/net/tun as udev makes it on Debian (0666: a unit's
	// non-root espd opens it), whatever this machine's mode.
	mounts = append(mounts, "mount -t tmpfs -o mode=0755 tmpfs /dev/net", "mknod -m 0666 /dev/net/tun c 10 200")
	// The package's user, as its maintainer scripts create it (in the
	// overlay: the machine's /etc is untouched).
	mounts = append(mounts, "getent group espd >/dev/null || groupadd --system espd",
		"getent passwd espd >/dev/null || useradd --system -g espd --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin espd")
	script := strings.Join(mounts, "\n") + "\ntouch " + ready + "\nexec sleep infinity\n"
	var err error
	g.holder, err = node.Start(filepath.Join(g.dir, "holder.log"), "unshare", "--mount", "--propagation", "private", "sh", "-ec", script)
	if err != nil {
		t.Fatal(err)
	}
	if !testbed.Poll(10*time.Second, 20*time.Millisecond, func() bool {
		_, err := os.Stat(ready)
		return err == nil
	}) {
		t.Fatalf("gateway %s: the mount namespace is not ready:\n%s", name, g.holder.Log())
	}
	return g
}

// root returns path as the gateway's mount namespace sees it, from this
// process's.
func (g *gateway) root(path string) string {
	return fmt.Sprintf("/proc/%d/root%s", g.holder.Pid(), path)
}

// enter is the command prefix that runs a command in the gateway's
// mount namespace (the network namespace comes from Node.Run and
// Node.Start).
func (g *gateway) enter() []string {
	return []string{"nsenter", "-t", strconv.Itoa(g.holder.Pid()), "-m", "--"}
}

// shell runs script with sh -e in the gateway's namespaces, in a root
// login's environment, and fails the test when it fails.
func (g *gateway) shell(t *testing.T, where, script string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	argv := append(g.enter(), "env", "-i", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C",
		"sh", "-ec", "cd /\n"+script)
	out, err := g.node.Run(ctx, argv...)
	t.Logf("gateway %s, %s:\n%s%s", g.name, where, indent(script, "$ "), indent(out, "  "))
	if err != nil {
		t.Fatalf("gateway %s, %s: %v", g.name, where, err)
	}
}

// execLines returns the commands of a unit's key (ExecStart,
// ExecStartPost) as systemd reads them from the unit file and its drop-ins
// in order: each line adds a command, an empty one clears the list. base,
// if set, is the list before the files. Commands with variables,
// specifiers or quoting fail the test: it does not expand them.
func execLines(t *testing.T, key string, base []string, files ...string) [][]string {
	t.Helper()
	var cmds [][]string
	if base != nil {
		cmds = append(cmds, base)
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			v, ok := strings.CutPrefix(strings.TrimSpace(line), key+"=")
			switch {
			case !ok:
			case v == "":
				cmds = nil
			case strings.ContainsAny(v, "$%\\\"'"):
				t.Fatalf("%s: %s=%s uses variables, specifiers or quoting this test does not expand", file, key, v)
			default:
				cmds = append(cmds, strings.Fields(strings.TrimLeft(v, "-@:+!")))
			}
		}
	}
	return cmds
}

// unitStart returns the ExecStart command of the unit (espd or
// strongswan) as systemd would run it on g: the unit file with the
// drop-ins that deploy.md's commands wrote in g's /etc/systemd/system.
// espd.service is this checkout's packaging/systemd/espd.service, or,
// until the unit exists in the checkout, the command deploy.md says it
// runs; strongswan.service is the installed one.
func (g *gateway) unitStart(t *testing.T, unit string) (start []string, post [][]string, files []string) {
	t.Helper()
	var base []string
	switch unit {
	case "espd", "espd-ike":
		file := "../packaging/systemd/" + unit + ".service"
		if _, err := os.Stat(file); errors.Is(err, os.ErrNotExist) {
			t.Logf("%s does not exist: %s.service taken to start %q", file, unit, fallbackStart[unit])
			base = strings.Fields(fallbackStart[unit])
		} else {
			files = append(files, file)
		}
	case "strongswan":
		files = append(files, g.root("/lib/systemd/system/strongswan.service"))
	default:
		t.Fatalf("gateway %s: the test runs only espd.service and strongswan.service, not %s", g.name, unit)
	}
	dropins, err := filepath.Glob(g.root("/etc/systemd/system/" + unit + ".service.d/*.conf"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, dropins...)
	starts := execLines(t, "ExecStart", base, files...)
	if len(starts) != 1 {
		t.Fatalf("gateway %s: %s.service has %d ExecStart commands, want 1", g.name, unit, len(starts))
	}
	return starts[0], execLines(t, "ExecStartPost", nil, files...), files
}

// unitSetting returns the values of a [Service] setting in the unit files,
// in order, as systemd reads them: each line adds its words, an empty one
// clears the list.
func unitSetting(t *testing.T, key string, files []string) []string {
	t.Helper()
	var vals []string
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), key+"="); ok {
				if v == "" {
					vals = nil
				}
				vals = append(vals, strings.Fields(v)...)
			}
		}
	}
	return vals
}

// asUnitUser returns the command prefix that runs a command as the unit's
// User= and Group= with exactly its AmbientCapabilities= (and
// CapabilityBoundingSet=), as systemd would, after making its
// RuntimeDirectory= and StateDirectory= theirs; nothing when the unit
// runs as root.
func (g *gateway) asUnitUser(t *testing.T, files []string) []string {
	t.Helper()
	last := func(key, def string) string {
		if v := unitSetting(t, key, files); len(v) > 0 {
			return v[len(v)-1]
		}
		return def
	}
	user := last("User", "root")
	if user == "root" {
		return nil
	}
	group := last("Group", user)
	caps := func(key string) string {
		list := []string{"-all"}
		for _, c := range unitSetting(t, key, files) {
			list = append(list, "+"+strings.ToLower(strings.TrimPrefix(c, "CAP_")))
		}
		return strings.Join(list, ",")
	}
	var dirs []string
	for _, d := range []struct{ key, root, mode string }{{"RuntimeDirectory", "/run/", "0755"}, {"StateDirectory", "/var/lib/", "0755"}} {
		for _, name := range unitSetting(t, d.key, files) {
			dirs = append(dirs, fmt.Sprintf("install -d -o %s -g %s -m %s %s%s", user, group, last(d.key+"Mode", d.mode), d.root, name))
		}
	}
	if len(dirs) > 0 {
		g.shell(t, "the unit's directories, as systemd makes them", strings.Join(dirs, "\n"))
	}
	return []string{"setpriv", "--reuid=" + user, "--regid=" + group, "--init-groups",
		"--inh-caps=" + caps("AmbientCapabilities"), "--ambient-caps=" + caps("AmbientCapabilities"),
		"--bounding-set=" + caps("CapabilityBoundingSet"), "--"}
}

// flagValue returns the value of --name in argv, or def.
func flagValue(argv []string, name, def string) string {
	for i, a := range argv {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v
		}
		if a == "--"+name && i+1 < len(argv) {
			return argv[i+1]
		}
	}
	return def
}

// systemctl carries out a systemctl line of deploy.md, for espd.service
// and strongswan.service, as systemd would with their units.
func (g *gateway) systemctl(t *testing.T, line string) {
	t.Helper()
	t.Logf("gateway %s: %s (carried out by the test)", g.name, line)
	f := strings.Fields(line)
	if len(f) == 2 && f[1] == "daemon-reload" {
		return // the units are read at each start
	}
	if len(f) < 3 {
		t.Fatalf("gateway %s: %q: the test cannot carry this out", g.name, line)
	}
	// The verb is the words up to the first unit name.
	i := 1
	for i < len(f) && (strings.HasPrefix(f[i], "-") || f[i] == "enable" || f[i] == "disable" || f[i] == "start" ||
		f[i] == "stop" || f[i] == "restart" || f[i] == "reload" || f[i] == "is-active") {
		i++
	}
	if i == 1 || i == len(f) {
		t.Fatalf("gateway %s: %q: the test cannot carry this out", g.name, line)
	}
	for _, u := range f[i:] {
		g.systemctlUnit(t, line, strings.Join(f[1:i], " "), strings.TrimSuffix(u, ".service"))
	}
}

// systemctlUnit carries out systemctl's verb for one unit.
func (g *gateway) systemctlUnit(t *testing.T, line, verb, unit string) {
	t.Helper()
	p := &g.espd
	if unit == "strongswan" {
		p = &g.charon
	}
	running := *p != nil && (unit == "strongswan" || g.espdUnit == unit)
	if running {
		running, _ = (*p).Exited()
		running = !running
	}
	switch verb {
	case "enable --now", "start", "restart":
		if verb == "restart" && running {
			if err := (*p).Stop(0); err != nil {
				t.Fatalf("gateway %s: %v\n%s", g.name, err, (*p).Log())
			}
		} else if running {
			return // systemctl would do nothing
		}
		if unit != "strongswan" && g.espd != nil {
			if done, _ := g.espd.Exited(); !done {
				t.Fatalf("gateway %s: %q: %s.service runs, and conflicts with %s.service", g.name, line, g.espdUnit, unit)
			}
		}
		start, post, files := g.unitStart(t, unit)
		argv := append(g.enter(), g.asUnitUser(t, files)...)
		var err error
		*p, err = g.node.Start(filepath.Join(g.dir, fmt.Sprintf("%s-%d.log", unit, g.started+1)), append(argv, start...)...)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if unit != "strongswan" {
			g.started++
			g.espdUnit = unit
			sock := g.root(flagValue(start, "socket", "/run/espd/espd.sock"))
			if err := testbed.WaitEspd(ctx, g.node, g.espd, sock, flagValue(start, "tun", "esp0")); err != nil {
				t.Fatalf("gateway %s: espd (%s): %v\n%s", g.name, strings.Join(start, " "), err, g.espd.Log())
			}
		} else {
			// charon-systemd is ready when its vici socket is.
			if !testbed.Poll(20*time.Second, 50*time.Millisecond, func() bool {
				c, err := net.Dial("unix", g.root("/run/charon.vici"))
				if err == nil {
					c.Close()
				}
				return err == nil
			}) {
				t.Fatalf("gateway %s: %s started no vici socket\n%s", g.name, strings.Join(start, " "), g.charon.Log())
			}
		}
		for _, cmd := range post {
			g.shell(t, "ExecStartPost of "+unit+".service", strings.Join(cmd, " "))
		}
	case "reload":
		if unit == "strongswan" || !running {
			t.Fatalf("gateway %s: %q: the test reloads only a running espd", g.name, line)
		}
		g.mustRun(t)
		before := strings.Count(g.espd.Log(), "configuration reloaded")
		if err := g.espd.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		// systemctl reload returns once the reload is done (Type=notify);
		// espd's log says when.
		if !testbed.Poll(10*time.Second, 50*time.Millisecond, func() bool {
			return strings.Count(g.espd.Log(), "configuration reloaded") > before
		}) {
			t.Fatalf("gateway %s: espd did not reload its configuration:\n%s", g.name, g.espd.Log())
		}
	case "is-active":
		if !running {
			t.Fatalf("gateway %s: %q: %s is not running", g.name, line, unit)
		}
	case "disable --now", "stop":
		if !running {
			return // systemctl stops nothing and succeeds
		}
		if err := (*p).Stop(0); err != nil {
			t.Fatalf("gateway %s: %v\n%s", g.name, err, (*p).Log())
		}
		if unit != "strongswan" {
			g.stopped++
		}
	default:
		t.Fatalf("gateway %s: %q: the test cannot carry out this systemctl verb", g.name, line)
	}
}

func (g *gateway) mustRun(t *testing.T) {
	t.Helper()
	if g.espd == nil {
		t.Fatalf("gateway %s: espd was never started", g.name)
	}
	if done, err := g.espd.Exited(); done {
		t.Fatalf("gateway %s: espd exited: %v\n%s", g.name, err, g.espd.Log())
	}
}

// scp carries out an "scp -p FILES root@ADDRESS:DIR" line of deploy.md:
// it copies the files, with their mode, into DIR of the gateway that has
// ADDRESS.
func scp(t *testing.T, from *gateway, gws []*gateway, line string) {
	t.Helper()
	m := scpLine.FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("gateway %s: %q: the test carries out only scp -p /FILE... root@ADDRESS:/DIR", from.name, line)
	}
	var to *gateway
	for _, g := range gws {
		if g.transit.String() == m[2] {
			to = g
		}
	}
	if to == nil {
		t.Fatalf("gateway %s: %q: no gateway has the address %s", from.name, line, m[2])
	}
	t.Logf("gateway %s: %s (carried out by the test: copied to gateway %s)", from.name, line, to.name)
	for _, src := range strings.Fields(m[1]) {
		fi, err := os.Stat(from.root(src))
		if err != nil {
			t.Fatal(err)
		}
		if err := copyFile(from.root(src), to.root(filepath.Join(m[3], filepath.Base(src))), fi.Mode().Perm()); err != nil {
			t.Fatalf("gateway %s: %q: %v", from.name, line, err)
		}
	}
}

// run runs a tested block on g: its shell lines with sh -e, its systemctl
// and scp lines carried out by the test, in order.
func (g *gateway) run(t *testing.T, b docBlock, gws []*gateway) {
	t.Helper()
	where := fmt.Sprintf("%s:%d", deployDoc, b.line)
	var chunk []string
	flush := func() {
		if len(chunk) > 0 {
			g.shell(t, where, strings.Join(chunk, "\n")+"\n")
			chunk = nil
		}
	}
	inHeredoc := ""
	for _, line := range strings.Split(strings.TrimSuffix(b.text, "\n"), "\n") {
		switch {
		case inHeredoc != "":
			if line == inHeredoc {
				inHeredoc = ""
			}
			chunk = append(chunk, line)
		case strings.HasPrefix(line, "systemctl "):
			flush()
			g.systemctl(t, line)
		case strings.HasPrefix(line, "scp "):
			flush()
			scp(t, g, gws, line)
		default:
			if _, after, ok := strings.Cut(line, "<<'"); ok {
				inHeredoc, _, _ = strings.Cut(after, "'")
			}
			chunk = append(chunk, line)
		}
	}
	flush()
}
