package strongswantest

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/espd/espd/internal/docblock"
	"github.com/espd/espd/testbed"
)

// The nodes of TestHAPair's pair (ha_test.go) and what the tests read of them.

// haNode is one node of the pair.
type haNode struct {
	*gateway
	keepalived *testbed.Process
	// notifyLog receives docs/ha.md's notify script's lines: start,
	// espd and done for each state change.
	notifyLog string
}

// haDoc returns docs/ha.md's one block of language lang marked marker,
// without its comment lines.
func haDoc(t *testing.T, lang, marker string) string {
	t.Helper()
	text, err := docblock.One("../../docs/ha.md", lang, marker)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, l := range strings.SplitAfter(text, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l)
		}
	}
	return b.String()
}

// haCharonOptions is the strongswan.conf of a node: docs/ha.md's ha
// plugin section as written (node 1's; for node 2 its local and remote
// swapped) with the section its secret block made (secret, the same on
// both nodes), and the IKE and configuration logs at level 2 (IKE_SA state
// changes, HA messages received).
func haCharonOptions(t *testing.T, local, remote netip.Prefix, secret string) charonOptions {
	t.Helper()
	ha := haDoc(t, "conf", "ha strongswan")
	l1, r1 := "local = "+testbed.Node1SyncV4.Addr().String(), "remote = "+testbed.Node2SyncV4.Addr().String()
	if !strings.Contains(ha, l1) || !strings.Contains(ha, r1) {
		t.Fatalf("docs/ha.md's ha section is not node 1's (%q, %q):\n%s", l1, r1, ha)
	}
	ha = strings.NewReplacer(l1, "local = "+local.Addr().String(), r1, "remote = "+remote.Addr().String()).Replace(ha)
	return charonOptions{Plugins: "ha", Log: "ike = 2\n      cfg = 2", Extra: ha + secret}
}

// haEspdFlags are the pair's flags of node i (0 or 1) as docs/ha.md gives
// node 1's, with the key and role files.
func haEspdFlags(i int, key, roleFile string) []string {
	syncs := []netip.Prefix{testbed.Node1SyncV4, testbed.Node2SyncV4}
	return []string{"--pair-node", strconv.Itoa(i + 1),
		"--pair-listen", netip.AddrPortFrom(syncs[i].Addr(), haPairPort).String(),
		"--pair-peer", netip.AddrPortFrom(syncs[1-i].Addr(), haPairPort).String(),
		"--pair-local-addr", syncs[i].Addr().String(),
		"--pair-key-file", key, "--pair-role-file", roleFile}
}

// haFIFO is the ha plugin's control FIFO of g's charon, as the host sees
// it: in the private /run of charon's mount namespace.
func haFIFO(g *gateway) string {
	return fmt.Sprintf("/proc/%d/root/run/charon.ha", g.charon.Pid())
}

// haNotifyScript writes into dir docs/ha.md's notify script as written
// and a wrapper that runs it with this node's paths (charon's pid and
// FIFO, as the host sees them in charon's private /run; espctl with the
// node's socket; the role file and the log), and returns the wrapper's
// path: keepalived's vrrp_notify_fifo_script.
func haNotifyScript(t *testing.T, dir string, charonPid int, logPath, sock, roleFile string) string {
	t.Helper()
	script, err := docblock.One("../../docs/ha.md", "sh", "ha notify")
	if err != nil {
		t.Fatal(err)
	}
	charon := "none"
	if charonPid != 0 {
		charon = strconv.Itoa(charonPid)
	}
	return testbed.WriteNotifyScript(t, dir, script, "CHARON_PID="+charon, "CHARON_HA_FIFO=/proc/"+charon+"/root/run/charon.ha",
		"ESPCTL="+espctlBin+" -s "+sock, "ESPD_PAIR_LOG="+logPath, "ESPD_PAIR_ROLE_FILE="+roleFile)
}

// startKeepalived starts the node's keepalived with docs/ha.md's
// configuration (haKeepalivedConf) and its notify script.
func (n *haNode) startKeepalived(t *testing.T, priority int) {
	t.Helper()
	n.notifyLog = filepath.Join(n.dir, "notify.log")
	script := haNotifyScript(t, n.dir, n.charon.Pid(), n.notifyLog, n.sock, n.roleFile())
	conf := haKeepalivedConf(t, n, priority, filepath.Join(n.dir, "keepalived.events"), script)
	n.keepalived = testbed.StartKeepalived(t, n.node, n.dir, conf)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("keepalived on %s logged:\n%s", n.name, tail(n.keepalived.Log(), 40))
			t.Logf("notify script on %s:\n%s", n.name, n.notifies())
		}
	})
}

var saAddrsRE = regexp.MustCompile(`(?m)^spi 0x([0-9a-f]{8}) dir (in|out) state (\S+).*\n\s+src (\S+) dst (\S+)`)

// pairSPIs returns the SPIs of espd's states of the pair, by direction:
// those of the pair's transit address, not the ha plugin's tunnel between
// the nodes' sync addresses.
func (n *haNode) pairSPIs() map[string][]string {
	n.t.Helper()
	vip := testbed.GwATransitV4.Addr().String()
	spis := map[string][]string{}
	for _, m := range saAddrsRE.FindAllStringSubmatch(n.mustEspctl("sa", "list"), -1) {
		if m[3] != "larval" && (m[4] == vip || m[5] == vip) {
			spis[m[2]] = append(spis[m[2]], m[1])
		}
	}
	return spis
}

// roleFile is where the notify script records the node's role for espd:
// in a directory the script makes, as docs/ha.md's /var/lib/espd-pair.
func (n *haNode) roleFile() string { return filepath.Join(n.dir, "espd-pair", "role") }

// notifies returns the notify script's log.
func (n *haNode) notifies() string {
	b, _ := os.ReadFile(n.notifyLog)
	return string(b)
}

// lastNotify returns the last line of the notify script's log.
func (n *haNode) lastNotify() string {
	lines := strings.Split(strings.TrimSpace(n.notifies()), "\n")
	return lines[len(lines)-1]
}

// lastNotifyAt returns when the notify script last logged event
// ("start": keepalived told it; "done": charon took it) for cmd ("+1"),
// or the zero time.
func (n *haNode) lastNotifyAt(event, cmd string) time.Time {
	var at time.Time
	for _, l := range strings.Split(n.notifies(), "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[1] == event && f[2] == cmd {
			if sec, err := strconv.ParseFloat(f[0], 64); err == nil {
				at = time.Unix(0, int64(sec*1e9))
			}
		}
	}
	return at
}

var haSegmentRE = regexp.MustCompile(`HA segment (\d+) (activated|deactivated), now active: (\S+)`)

// segmentActive reports whether the node's charon last logged the
// segment active (the ha plugin logs every change; none means inactive).
func (n *haNode) segmentActive() bool {
	active := false
	for _, m := range haSegmentRE.FindAllStringSubmatch(n.charon.Log(), -1) {
		active = strings.Contains(","+m[3]+",", fmt.Sprintf(",%d,", haSegment))
	}
	return active
}

// activations counts how often the node's charon activated the segment.
func (n *haNode) activations() int {
	return testbed.CountLines(n.charon.Log(), fmt.Sprintf("HA segment %d activated", haSegment))
}

var ikeStateRE = regexp.MustCompile(`(?m)^s2s: #\d+, (\S+),`)

// ikeState returns the state of the IKE_SA s2s as swanctl lists it, or "".
func (g *gateway) ikeState() string {
	out, err := g.swanctl("--list-sas")
	if err != nil {
		return ""
	}
	if m := ikeStateRE.FindStringSubmatch(out); m != nil {
		return m[1]
	}
	return ""
}

// crashProcess sends SIGKILL to p's whole process group (testbed.Node.Start
// gives each process one of its own) without waiting: keepalived's VRRP
// child dies with its parent instead of shutting down in order (on its
// parent's death alone it would release the addresses and hand over at
// once, which a crashed node does not). reapKilled waits for it.
func crashProcess(t *testing.T, p *testbed.Process) {
	t.Helper()
	if err := syscall.Kill(-p.Pid(), syscall.SIGKILL); err != nil {
		t.Fatalf("%s: %v", p.Name, err)
	}
}

// reapKilled waits for a process killed with SIGKILL to be gone and marks
// it stopped (so that the node's clean-up does not report its exit).
func reapKilled(t *testing.T, p *testbed.Process) {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("%s survived SIGKILL", p.Name)
	}
	p.Stop(time.Second) // its exit status is the kill
}

// espdStats is what "espctl --json stats" reports, as far as used here.
type espdStats struct {
	Global struct {
		Drops      map[string]uint64 `json:"drops"`
		InvalidSPI uint64            `json:"invalid_spi"`
		NoState    uint64            `json:"no_state"`
		Malformed  uint64            `json:"malformed"`
	} `json:"global"`
	SAs []struct {
		SPI   uint32 `json:"spi"`
		Dst   string `json:"dst"`
		Dir   string `json:"dir"`
		Stats struct {
			Packets   uint64            `json:"packets"`
			SeqOut    uint64            `json:"seq_out"`
			ReplayTop uint64            `json:"replay_top"`
			Drops     map[string]uint64 `json:"drops"`
		} `json:"stats"`
	} `json:"sas"`
}

// stats reads espd's counters.
func (g *gateway) stats() espdStats {
	g.t.Helper()
	out := g.mustEspctl("--json", "stats")
	var s espdStats
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		g.t.Fatalf("%s: espctl --json stats: %v\n%s", g.name, err, out)
	}
	return s
}

// saLine describes espd's state spi (hex, as swanctl shows it) from the
// counters: direction, packets, next outbound sequence number, top of the
// replay window and the non-zero drops.
func (s espdStats) saLine(spi string) string {
	for _, x := range s.SAs {
		if fmt.Sprintf("%08x", x.SPI) == spi {
			return fmt.Sprintf("spi %s dir %s packets %d seq_out %d replay_top %d drops %v",
				spi, x.Dir, x.Stats.Packets, x.Stats.SeqOut, x.Stats.ReplayTop, nonZero(x.Stats.Drops))
		}
	}
	return fmt.Sprintf("spi %s: no such state", spi)
}

// saDrop returns the drop counter reason of espd's state spi.
func (s espdStats) saDrop(spi, reason string) uint64 {
	for _, x := range s.SAs {
		if fmt.Sprintf("%08x", x.SPI) == spi {
			return x.Stats.Drops[reason]
		}
	}
	return 0
}

func nonZero(m map[string]uint64) map[string]uint64 {
	out := map[string]uint64{}
	for k, v := range m {
		if v != 0 {
			out[k] = v
		}
	}
	return out
}
