package docs

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/routing"
	"github.com/espd/espd/testbed"
)

// Paths that deploy.md is written against (the Debian package's).
const (
	deployDoc  = "deploy.md"
	espdPath   = "/usr/sbin/espd"
	espctlPath = "/usr/bin/espctl"
	// strongswanPlugin is what strongswan/build.sh (and the
	// strongswan-espd package) installs.
	strongswanPlugin = "/usr/lib/ipsec/plugins/libstrongswan-espd.so"
)

// fallbackStart is what each espd unit starts, per deploy.md, while the
// unit file is not in this checkout.
var fallbackStart = map[string]string{
	"espd":     espdPath + " --config /etc/espd/espd.toml",
	"espd-ike": espdPath + " --config /etc/espd/espd.toml --ike-handoff",
}

// deployHosts maps the info strings of deploy.md's tested blocks to the
// gateways that run them, in that order.
var deployHosts = map[string][]string{
	"sh gateway A":     {"A"},
	"sh gateway B":     {"B"},
	"sh both gateways": {"A", "B"},
}

// deployElsewhere names the marked blocks of deploy.md that other tests
// run, and where.
var deployElsewhere = map[string]string{
	"sh install espd":            "packaging: TestPackagesUnderSystemd and TestDeployUnderSystemd, on Debian 12 and 13",
	"sh install strongswan-espd": "packaging: TestPackagesUnderSystemd and TestDeployUnderSystemd, on Debian 12 and 13",
	"sh purge":                   "packaging: TestDeployUnderSystemd, on Debian 12 and 13",
}

// docBlock is one fenced block of deploy.md.
type docBlock struct {
	info    string // the fence's info string
	section string // the "## " heading it is under
	line    int    // of the opening fence
	text    string
}

// docBlocks returns the fenced blocks of the Markdown file path.
func docBlocks(t *testing.T, path string) []docBlock {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		blocks  []docBlock
		cur     *docBlock
		section string
		n       int
	)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
		line := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &docBlock{info: strings.TrimSpace(strings.TrimPrefix(line, "```")), section: section, line: n}
		case cur != nil && line == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.text += line + "\n"
		case strings.HasPrefix(line, "## "):
			section = strings.TrimPrefix(line, "## ")
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cur != nil {
		t.Fatalf("%s:%d: fence never closed", path, cur.line)
	}
	return blocks
}

// TestDeployBlocks checks the markup deploy_test relies on: every shell
// block is either run by TestDeploy (its info string names gateways) or
// plainly "sh", and the tested ones include the steps the test checks.
func TestDeployBlocks(t *testing.T) {
	var tested []docBlock
	for _, b := range docBlocks(t, deployDoc) {
		if _, ok := deployHosts[b.info]; ok {
			tested = append(tested, b)
		} else if _, ok := deployElsewhere[b.info]; !ok && strings.HasPrefix(b.info, "sh") && b.info != "sh" {
			t.Errorf("%s:%d: info string %q names no gateway deploy_test knows", deployDoc, b.line, b.info)
		}
	}
	all := ""
	for _, b := range tested {
		all += b.text
	}
	for _, want := range []string{"systemctl enable --now espd\n", "systemctl disable --now espd\n", "espd --cleanup\n", "ping -c 3 -I 198.18.1.1 198.18.2.1\n", "scp -p "} {
		if !strings.Contains(all, want) {
			t.Errorf("no tested block of %s runs %q", deployDoc, want)
		}
	}
}

// overlaid are the directories each gateway sees as overlays.
var overlaid = []string{"/etc", "/run", "/var/lib", "/usr/bin", "/usr/sbin"}

var scpLine = regexp.MustCompile(`^scp -p ((?:/\S+ )+)root@(\S+):(/\S*)$`)

// TestDeploy runs deploy.md's tested blocks on two gateways of a testbed
// (see the page's last section), sends traffic between the LAN hosts
// through the tunnel they set up and checks that espd --cleanup left
// nothing of espd's in either gateway's routing.
func TestDeploy(t *testing.T) {
	for _, need := range []string{"unshare", "nsenter", "ping", "od", "sysctl", "swanctl", "/usr/sbin/charon-systemd", strongswanPlugin} {
		if _, err := exec.LookPath(need); err == nil {
			continue
		} else if _, serr := os.Stat(need); serr == nil {
			continue
		} else if os.Getenv("CI") == "true" {
			t.Fatalf("deploy.md's commands need %s: %v", need, err)
		} else {
			t.Skipf("deploy.md's commands need %s: %v", need, err)
		}
	}
	// Made before the testbed, so that it is removed after the testbed
	// has stopped the processes that use it.
	base := t.TempDir()
	top := testbed.NewT(t, testbed.Options{})
	bin := filepath.Join(base, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	espd, espctl := filepath.Join(bin, "espd"), filepath.Join(bin, "espctl")
	for _, b := range []struct{ out, pkg string }{{espd, testbed.EspdPackage}, {espctl, testbed.EspctlPackage}} {
		if err := testbed.GoBuild(b.out, b.pkg); err != nil {
			t.Fatal(err)
		}
	}
	gws := []*gateway{
		newGateway(t, base, "A", top.GwA, testbed.GwATransitV4.Addr(), espd, espctl),
		newGateway(t, base, "B", top.GwB, testbed.GwBTransitV4.Addr(), espd, espctl),
	}
	byName := map[string]*gateway{"A": gws[0], "B": gws[1]}

	blocks := docBlocks(t, deployDoc)
	ran := 0
	for i, b := range blocks {
		hosts, ok := deployHosts[b.info]
		if !ok {
			continue
		}
		for _, h := range hosts {
			byName[h].run(t, b, gws)
			ran++
		}
		last := i+1 == len(blocks) || blocks[i+1].section != b.section
		if last && strings.HasPrefix(b.section, "5.") {
			lanTraffic(t, top)
		}
	}
	if ran == 0 {
		t.Fatal("no tested block in ", deployDoc)
	}
	for _, g := range gws {
		if g.started == 0 || g.stopped == 0 {
			t.Errorf("gateway %s: espd started %d times, stopped %d times by the page's blocks", g.name, g.started, g.stopped)
		}
		if left := espdRouting(t, g.node); left != "" {
			t.Errorf("gateway %s: after espd --cleanup, espd's routing is still there:\n%s", g.name, left)
		}
	}
}

// lanTraffic sends a TCP transfer from the client to the server and back,
// over IPv4 and IPv6, through the tunnel the page set up.
func lanTraffic(t *testing.T, top *testbed.Topology) {
	t.Helper()
	for _, c := range []struct {
		from, to *testbed.Node
		dst      netip.Addr
	}{
		{top.Client, top.Server, testbed.ServerV4.Addr()},
		{top.Server, top.Client, testbed.ClientV4.Addr()},
		{top.Client, top.Server, testbed.ServerV6.Addr()},
		{top.Server, top.Client, testbed.ClientV6.Addr()},
	} {
		r, err := testbed.Transfer(context.Background(), testbed.TransferOptions{From: c.from, To: c.to, Dst: c.dst, Bytes: 4 << 20, Timeout: 30 * time.Second})
		if err != nil {
			t.Fatalf("LAN traffic %s -> %v through the tunnel: %v", c.from.Role, c.dst, err)
		}
		t.Logf("LAN traffic %s -> %v through the tunnel: %v", c.from.Role, c.dst, r)
	}
}

// espdRouting returns the rules and routes of espd's (its table, its
// route protocol) that n's routing holds, one a line.
func espdRouting(t *testing.T, n *testbed.Node) string {
	t.Helper()
	var left []string
	table := strconv.Itoa(routing.DefaultTable)
	for _, fam := range []string{"-4", "-6"} {
		out := n.MustIP(t, fam, "rule", "show")
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "lookup "+table) || strings.Contains(l, fmt.Sprintf("lookup %#x", routing.DefaultTable)) {
				left = append(left, l)
			}
		}
		out = n.MustIP(t, fam, "route", "show", "table", "all", "proto", strconv.Itoa(routing.Protocol))
		if s := strings.TrimSpace(out); s != "" {
			left = append(left, s)
		}
	}
	return strings.Join(left, "\n")
}

func copyFile(src, dst string, mode os.FileMode) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		return err
	}
	return os.Chmod(dst, mode)
}

func indent(s, prefix string) string {
	if s == "" {
		return ""
	}
	return prefix + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", "\n"+prefix) + "\n"
}
