package packaging

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// TestPackagesLifecycle is docs/safety.md's table on the real stack: the
// packages installed and docs/deploy.md's section 6 run as
// TestPackagesUnderSystemd does, in containers whose root file systems
// persist across boots, with default routes in both gateways' main tables
// toward the transit link (so that a packet that escapes espd's table
// crosses it in clear), traffic both ways between the LANs (client and
// server ping each other, IPv4 and IPv6, 20 a second each) and the transit
// link captured at both ends from the first event to the last, across
// the power-offs and boots (transitCaptures). The events, on each gateway
// in turn where both make sense: the CHILD_SA rekeyed (bed.rekey), espd
// SIGKILLed (systemd restarts it), espd upgraded (apt-get reinstalls its
// package; its postinst restarts the unit), charon restarted, charon
// SIGKILLed, `apt-get remove strongswan-espd` on B then installed again
// (bed.pluginReinstalled), the same with charon restarted in between
// (bed.pluginRemovedRestart), both packages upgraded in one apt-get on the
// responder B, a reboot (A powered off cleanly, B's power cut; the kernel
// state a reboot loses is emptied while the container is down, and a unit
// in the container brings the links up at boot as Debian's
// networking.service would), and `apt-get remove espd` on A under a
// running charon.
//
// After each event but the removal, traffic must pass both ways again
// within maxEventGap (the longest time without a reply in any of the four
// directions, from the event, or from the power-on for a reboot or the
// reinstall of the plugin, to the next event); a rekey may cost each
// direction one request at most. After a boot, espd-holds.service must
// have put back the rules and holds before the links came up, and the
// rebooted gateway's own end of the capture must have seen the boot's
// IKE. After the removal, nothing crosses for 10 s of traffic (the holds
// stay). Up to `apt-get purge espd`, not one cleartext frame of the LANs
// crosses the transit link; after the purge, which opens the holds on
// purpose, the capture must see cleartext (it would have seen a leak
// before).
// maxEventGap bounds the outage an event may cause. It catches a tunnel
// that does not come back by itself, not a slow one: the gaps measured
// (about 0.3-1.6 s on an idle machine) are logged in the events' table,
// and an apt-get on a loaded CI machine has come within 0.2 s of 5 s.
const maxEventGap = 20 * time.Second

func TestPackagesLifecycle(t *testing.T) {
	for _, rel := range debianReleases {
		t.Run("debian"+rel, func(t *testing.T) { packagesLifecycle(t, rel) })
	}
}

func packagesLifecycle(t *testing.T, release string) {
	bed := newPackageBed(t, "nspawnlc"+release, true, release)
	defer func() {
		if t.Failed() {
			bed.logJournals(t, 150)
		}
	}()
	for _, name := range []string{"A", "B"} {
		peer := map[string]netip.Prefix{"A": testbed.GwBTransitV4, "B": testbed.GwATransitV4}[name]
		peer6 := map[string]netip.Prefix{"A": testbed.GwBTransitV6, "B": testbed.GwATransitV6}[name]
		bed.node(name).MustIP(t, "-4", "route", "add", "default", "via", peer.Addr().String())
		bed.node(name).MustIP(t, "-6", "route", "add", "default", "via", peer6.Addr().String())
		installBootUnits(t, bed.gw[name], name)
	}
	bed.section6(t)

	caps := newTransitCaptures(t, bed)
	pingers := lanPingers(t, bed.top)
	if !waitPassing(pingers, time.Now(), 30*time.Second) {
		t.Fatalf("no traffic both ways through the tunnel before the events")
	}

	var events []*lifecycleEvent
	run := func(name string, do func(ev *lifecycleEvent)) {
		t.Helper()
		ev := &lifecycleEvent{name: name, start: time.Now()}
		ev.t0 = ev.start
		events = append(events, ev)
		do(ev)
		ev.done = time.Now()
		bed.waitRecovered(t, ev, pingers)
		t.Logf("%s: recovered %v after the event", name, ev.recovered.Sub(ev.t0).Round(10*time.Millisecond))
	}
	for _, gw := range []string{"A", "B"} {
		run("CHILD_SA rekeyed by "+gw, func(ev *lifecycleEvent) { bed.rekey(t, ev, caps, pingers, gw) })
	}
	for _, gw := range []string{"A", "B"} {
		run("espd on "+gw+" SIGKILLed", func(*lifecycleEvent) { bed.killEspd(t, gw) })
	}
	for _, gw := range []string{"A", "B"} {
		run("espd on "+gw+" upgraded", func(*lifecycleEvent) {
			aptGet(t, bed.gw[gw], "/mnt/espd", "apt-get install --reinstall ./"+bed.espdDeb)
		})
	}
	for _, gw := range []string{"A", "B"} {
		run("charon on "+gw+" restarted", func(*lifecycleEvent) { bed.gw[gw].must(t, "systemctl", "restart", "strongswan") })
	}
	for _, gw := range []string{"A", "B"} {
		run("charon on "+gw+" SIGKILLed", func(*lifecycleEvent) { bed.killCharon(t, gw) })
	}
	run("B: strongswan-espd removed, reinstalled", func(ev *lifecycleEvent) { bed.pluginReinstalled(t, ev, pingers, "B") })
	run("B: plugin removed, charon restarted", func(ev *lifecycleEvent) { bed.pluginRemovedRestart(t, ev, pingers, "B") })
	run("B: espd and plugin upgraded", func(*lifecycleEvent) {
		aptGet(t, bed.gw["B"], "/mnt/espd", "apt-get install --reinstall ./"+bed.espdDeb+" ./"+bed.pluginDeb)
	})
	run("A rebooted (poweroff)", func(ev *lifecycleEvent) { bed.reboot(t, ev, "A", false) })
	run("B rebooted (power cut)", func(ev *lifecycleEvent) { bed.reboot(t, ev, "B", true) })

	// The removal: espd's prerm stops it, charon keeps running, the holds
	// stay. No reply may come back to a request sent after it.
	removal := time.Now()
	aptGet(t, bed.gw["A"], "/", "apt-get remove espd")
	removed := time.Now()
	if out, _ := bed.gw["A"].run(nil, "dpkg-query", "-W", "-f", "${db:Status-Abbrev}", "espd", "strongswan-espd"); strings.Contains(out, "ii") {
		t.Errorf("gateway A: after apt-get remove espd: %q, want both removed", out)
	}
	held := bed.holds(t, "A")
	if !strings.Contains(held, "blackhole "+testbed.LANBV4.String()) || !strings.Contains(held, "blackhole "+testbed.LANBV6.String()) {
		t.Errorf("gateway A: after apt-get remove espd the holds are gone:\n%s", held)
	}
	if !testbed.Poll(30*time.Second, 200*time.Millisecond, func() bool {
		for _, p := range pingers {
			if p.update(); !p.sentAfter(removed.Add(10 * time.Second)) {
				return false
			}
		}
		return true
	}) {
		t.Errorf("the pingers did not send for 10 s after the removal")
	}
	for _, p := range pingers {
		if n := p.repliesSince(removed); n > 0 {
			t.Errorf("%s: %d replies to requests sent after espd was removed on A", p.name, n)
		}
	}
	events = append(events, &lifecycleEvent{name: "espd removed on A", start: removal, t0: removal, done: removed})

	// The purge opens the holds on purpose: the capture must then see the
	// cleartext it has not seen before.
	purge := time.Now()
	aptGet(t, bed.gw["A"], "/", "apt-get purge espd")
	if held := bed.holds(t, "A"); strings.Contains(held, "58832") || strings.Contains(held, "proto 229") {
		t.Errorf("gateway A: after apt-get purge espd:\n%s", held)
	}
	if !testbed.Poll(10*time.Second, 500*time.Millisecond, func() bool { return caps.leaksSince(purge) > 0 }) {
		t.Errorf("no cleartext on the transit link after the purge: the capture does not see what it should")
	}
	results := caps.stop(t)

	var table strings.Builder
	for i, ev := range events {
		end := purge
		if i+1 < len(events) {
			end = events[i+1].start
		}
		if i == len(events)-1 {
			fmt.Fprintf(&table, "\n  %-30s command %6v  (no recovery expected)", ev.name, ev.done.Sub(ev.start).Round(10*time.Millisecond))
			break
		}
		gap, who := time.Duration(0), ""
		for _, p := range pingers {
			if g := p.longestSilence(ev.t0, end); g > gap {
				gap, who = g, p.name
			}
		}
		fmt.Fprintf(&table, "\n  %-30s command %6v  gap %6v (%s)", ev.name, ev.done.Sub(ev.start).Round(10*time.Millisecond), gap.Round(10*time.Millisecond), who)
		if gap > maxEventGap {
			t.Errorf("%s: traffic stopped for %v (%s), want at most %v", ev.name, gap.Round(10*time.Millisecond), who, maxEventGap)
		}
	}
	t.Logf("the events, and the longest time without a reply after each:%s", table.String())
	captureReport(t, events, results, purge)

	leaks := 0
	for _, r := range results {
		t.Logf("transit link, %s", r.summary)
		for _, f := range r.res.Leaks(lanAddrs...) {
			if f.Time.Before(purge) {
				if leaks < 10 {
					t.Errorf("cleartext on the transit link (%s) at %s: %s", r.side, f.Time.Format("15:04:05.000"), f.String())
				}
				leaks++
			}
		}
		if !r.res.Complete() {
			t.Errorf("capture %s incomplete: %d dropped, %d over the limit", r.side, r.res.Drops, r.res.Overflow)
		}
	}
	t.Logf("cleartext frames of the LANs on the transit link before the purge: %d", leaks)
	if leaks > 0 {
		t.Errorf("%d cleartext frames of the LANs crossed the transit link before the purge", leaks)
	}
}

// lanAddrs are the LAN hosts' addresses: a frame on the transit link that
// carries one in clear is a leak.
var lanAddrs = []netip.Addr{testbed.ClientV4.Addr(), testbed.ClientV6.Addr(), testbed.ServerV4.Addr(), testbed.ServerV6.Addr()}

// lifecycleEvent is one event of TestPackagesLifecycle.
type lifecycleEvent struct {
	name string
	// start is when the event began (for a reboot, the power-off), t0
	// from when its gap counts (for a reboot, the power-on), done when
	// its command returned, recovered when traffic passed both ways again.
	start, t0, done, recovered time.Time
	// rebooted names the gateway a reboot rebooted.
	rebooted string
}

// linksScript brings a gateway's links up as ifupdown would from
// /etc/network/interfaces, after printing the rules and espd's table as
// they are at that moment (in the unit's journal).
const linksScript = `#!/bin/sh
set -e
echo "before the links come up:"
ip -4 rule show
ip -6 rule show
ip -4 route show table 58832
ip -6 route show table 58832
ip link set %[1]s up
ip link set %[2]s up
ip addr replace %[3]s dev %[1]s
ip addr replace %[4]s dev %[1]s nodad
ip addr replace %[5]s dev %[2]s
ip addr replace %[6]s dev %[2]s nodad
ip -4 route replace default via %[7]s
ip -6 route replace default via %[8]s
echo "links up"
`

// linksUnit is the test's stand-in for Debian's networking.service
// (ifupdown), ordered as that one is.
const linksUnit = `[Unit]
Description=the test bed's links, addresses and default routes (as networking.service)
DefaultDependencies=no
Wants=network.target
After=local-fs.target network-pre.target systemd-sysctl.service
Before=network.target network-online.target shutdown.target
Conflicts=shutdown.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/local/sbin/espd-test-links

[Install]
WantedBy=multi-user.target network-online.target
`

// tunModeUnit is the test's stand-in for udev's rule that makes
// /dev/net/tun 0666 at boot (there is no udev in the container, and
// systemd-nspawn makes the node 0600 at every boot).
const tunModeUnit = `[Unit]
Description=/dev/net/tun 0666 (as udev's 50-udev-default.rules)
DefaultDependencies=no
Before=sysinit.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/chmod 0666 /dev/net/tun

[Install]
WantedBy=sysinit.target
`

// installBootUnits writes and enables espd-test-links.service and
// espd-test-tun.service in the gateway's container; they run at the next
// boot.
func installBootUnits(t *testing.T, c *container, name string) {
	t.Helper()
	a := map[string][]netip.Prefix{
		"A": {testbed.GwATransitV4, testbed.GwATransitV6, testbed.GwALANV4, testbed.GwALANV6, testbed.GwBTransitV4, testbed.GwBTransitV6},
		"B": {testbed.GwBTransitV4, testbed.GwBTransitV6, testbed.GwBLANV4, testbed.GwBLANV6, testbed.GwATransitV4, testbed.GwATransitV6},
	}[name]
	script := fmt.Sprintf(linksScript, testbed.IfTransit, testbed.IfLAN, a[0], a[1], a[2], a[3], a[4].Addr(), a[5].Addr())
	for _, f := range []struct{ path, mode, content string }{
		{"/usr/local/sbin/espd-test-links", "0755", script},
		{"/etc/systemd/system/espd-test-links.service", "0644", linksUnit},
		{"/etc/systemd/system/espd-test-tun.service", "0644", tunModeUnit},
	} {
		if out, err := c.run([]byte(f.content), "install", "-m", f.mode, "-D", "/dev/stdin", f.path); err != nil {
			t.Fatalf("gateway %s: writing %s: %v\n%s", name, f.path, err, out)
		}
	}
	c.must(t, "systemctl", "enable", "espd-test-links.service", "espd-test-tun.service")
}

// holds returns the rules and espd's table in the gateway's namespace.
func (bed *packageBed) holds(t *testing.T, name string) string {
	t.Helper()
	var b strings.Builder
	for _, args := range [][]string{{"-4", "rule", "show"}, {"-6", "rule", "show"}, {"-4", "route", "show", "table", "58832"}, {"-6", "route", "show", "table", "58832"}} {
		b.WriteString(bed.node(name).MustIP(t, args...))
	}
	return b.String()
}

// killEspd kills espd-ike.service's espd with SIGKILL and waits until
// systemd has started it again (Restart=on-failure). --kill-who=main: the
// unit has that one process, and on a machine with cgroup v1 the
// container's systemd fails to signal its cgroup v2 groups (EIO) after it
// has signalled the main process, and says so with an exit status of 1.
func (bed *packageBed) killEspd(t *testing.T, name string) {
	t.Helper()
	c := bed.gw[name]
	before := c.show(t, "espd-ike.service", "MainPID", "NRestarts")
	c.must(t, "systemctl", "kill", "-s", "KILL", "--kill-who=main", "espd-ike")
	var p map[string]string
	if !testbed.Poll(20*time.Second, 100*time.Millisecond, func() bool {
		p = c.show(t, "espd-ike.service", "MainPID", "NRestarts", "ActiveState")
		return p["ActiveState"] == "active" && p["MainPID"] != before["MainPID"] && p["NRestarts"] != before["NRestarts"]
	}) {
		t.Fatalf("gateway %s: espd-ike.service after SIGKILL: %v (before %v), want restarted by systemd", name, p, before)
	}
}

// killCharon kills strongswan.service's charon with SIGKILL (the main
// process only, as killEspd); systemd restarts it if the unit's Restart=
// covers a signal, and the test starts it otherwise.
func (bed *packageBed) killCharon(t *testing.T, name string) {
	t.Helper()
	c := bed.gw[name]
	before := c.show(t, "strongswan.service", "MainPID", "NRestarts", "Restart")
	c.must(t, "systemctl", "kill", "-s", "KILL", "--kill-who=main", "strongswan")
	if !slices.Contains([]string{"on-abnormal", "on-abort", "on-failure", "always"}, before["Restart"]) {
		t.Logf("gateway %s: strongswan.service has Restart=%s: the test starts it", name, before["Restart"])
		testbed.Poll(10*time.Second, 50*time.Millisecond, func() bool {
			return c.show(t, "strongswan.service", "MainPID")["MainPID"] != before["MainPID"]
		})
		c.must(t, "systemctl", "start", "strongswan")
		return
	}
	var p map[string]string
	if !testbed.Poll(30*time.Second, 100*time.Millisecond, func() bool {
		p = c.show(t, "strongswan.service", "MainPID", "NRestarts", "ActiveState")
		return p["ActiveState"] == "active" && p["MainPID"] != before["MainPID"] && p["NRestarts"] != before["NRestarts"]
	}) {
		t.Fatalf("gateway %s: strongswan.service after SIGKILL: %v (before %v), want restarted (Restart=%s)", name, p, before, before["Restart"])
	}
}

// reboot powers the gateway's container off (cleanly, or by cutting the
// power), empties what the kernel forgets at a reboot (the links' state and
// addresses, then every rule but the kernel's and the routes of the main
// table, charon's 220 and espd's), boots the same root file
// system again and checks that espd-holds.service put the holds back
// before espd-test-links.service brought the links up. ev.t0 is the
// power-on.
func (bed *packageBed) reboot(t *testing.T, ev *lifecycleEvent, name string, cut bool) {
	t.Helper()
	node := bed.node(name)
	ev.rebooted = name
	if cut {
		bed.gw[name].powerCut(t)
	} else {
		bed.gw[name].poweroff(t)
	}
	// The links first, as the power-off took them: from here on nothing
	// is forwarded, whatever the tables say.
	for _, ifname := range []string{testbed.IfTransit, testbed.IfLAN} {
		node.MustIP(t, "link", "set", ifname, "down")
		node.MustIP(t, "addr", "flush", "dev", ifname)
	}
	for _, fam := range []string{"-4", "-6"} {
		// Every rule but the kernel's own three (espd's, charon's table
		// 220), and the tables they look up.
		for _, l := range strings.Split(node.MustIP(t, fam, "rule", "show"), "\n") {
			pref, _, ok := strings.Cut(l, ":")
			if ok && pref != "0" && pref != "32766" && pref != "32767" {
				node.MustIP(t, fam, "rule", "del", "pref", pref)
			}
		}
		for _, table := range []string{"main", "220", "58832"} {
			node.IP(t.Context(), fam, "route", "flush", "table", table) // one that never existed is an error
		}
	}
	if held := bed.holds(t, name); strings.Contains(held, "58832") {
		t.Fatalf("gateway %s powered off: espd's rules or routes are still there:\n%s", name, held)
	}
	if out := node.MustIP(t, "-o", "link", "show"); strings.Contains(out, "esp0") {
		t.Fatalf("gateway %s powered off: espd's TUN is still there:\n%s", name, out)
	}

	ev.t0 = time.Now()
	c := boot(t, bed.roots[name], false, bed.debs, node)
	bed.gw[name] = c
	if p := c.show(t, "espd-ike.service", "NRestarts", "ActiveState"); p["NRestarts"] != "0" || p["ActiveState"] != "active" {
		t.Errorf("gateway %s after the boot: espd-ike.service %v, want active without a restart", name, p)
	}

	// The holds were back before the links came up: by systemd's
	// timestamps, in the journal's order, and in what the links unit saw.
	holds := c.show(t, "espd-holds.service", "ActiveState", "Result", "ConditionResult", "ExecMainExitTimestampMonotonic")
	links := c.show(t, "espd-test-links.service", "ActiveState", "Result", "ExecMainStartTimestampMonotonic")
	hEnd, _ := strconv.ParseUint(holds["ExecMainExitTimestampMonotonic"], 10, 64)
	lStart, _ := strconv.ParseUint(links["ExecMainStartTimestampMonotonic"], 10, 64)
	if holds["ActiveState"] != "active" || holds["Result"] != "success" || holds["ConditionResult"] != "yes" ||
		links["ActiveState"] != "active" || links["Result"] != "success" || hEnd == 0 || lStart < hEnd {
		t.Errorf("gateway %s after the boot: espd-holds.service %v, espd-test-links.service %v: want both run, the holds first", name, holds, links)
	}
	journal := c.must(t, "journalctl", "-b", "--no-pager", "-o", "short-monotonic", "-u", "espd-holds", "-u", "espd-test-links")
	i, j := strings.Index(journal, "Finished espd-holds.service"), strings.Index(journal, "Starting espd-test-links.service")
	if i < 0 || j < 0 || i > j {
		t.Errorf("gateway %s: the boot's journal does not show espd-holds.service finished before espd-test-links.service started:\n%s", name, journal)
	}
	remote := map[string][]netip.Prefix{"A": {testbed.LANBV4, testbed.LANBV6}, "B": {testbed.LANAV4, testbed.LANAV6}}[name]
	for _, want := range []string{"lookup 58832", "blackhole " + remote[0].String(), "blackhole " + remote[1].String()} {
		if !strings.Contains(journal, want) {
			t.Errorf("gateway %s: no %q in place when the links came up:\n%s", name, want, journal)
		}
	}
	t.Logf("gateway %s booted again:\n%s", name, testbed.Tail(journal, 30))
}

// spisRE finds the SPIs of an installed CHILD_SA in swanctl --list-sas --raw.
var spisRE = regexp.MustCompile(`state=INSTALLED [^{}]*?spi-in=([0-9a-f]{8}) spi-out=([0-9a-f]{8})`)

// tunnelUp reports whether the gateway's charon has an installed CHILD_SA
// whose two SAs espd holds.
func (bed *packageBed) tunnelUp(name string) bool {
	c := bed.gw[name]
	sas, err := c.run(nil, "swanctl", "--list-sas", "--raw")
	if err != nil {
		return false
	}
	list, err := c.run(nil, "espctl", "sa", "list")
	if err != nil {
		return false
	}
	for _, m := range spisRE.FindAllStringSubmatch(sas, -1) {
		if strings.Contains(list, "spi 0x"+m[1]+" ") && strings.Contains(list, "spi 0x"+m[2]+" ") {
			return true
		}
	}
	return false
}

// waitRecovered waits until both gateways' espd hold an installed
// CHILD_SA of their charon and a request sent since then has been answered
// in each of the pingers' directions, and sets ev.recovered.
func (bed *packageBed) waitRecovered(t *testing.T, ev *lifecycleEvent, pingers []*pinger) {
	t.Helper()
	var up time.Time
	if !testbed.Poll(60*time.Second, 200*time.Millisecond, func() bool {
		for _, p := range pingers {
			p.revive(t)
		}
		if up.IsZero() {
			if !bed.tunnelUp("A") || !bed.tunnelUp("B") {
				return false
			}
			up = time.Now()
		}
		return waitPassing(pingers, up, 0)
	}) {
		for _, p := range pingers {
			t.Logf("%s: %d replies to requests sent since the event, the last sent at %s", p.name, p.repliesSince(ev.start), p.lastReply().Format("15:04:05.000"))
		}
		for _, name := range []string{"A", "B"} {
			for _, argv := range [][]string{{"swanctl", "--list-sas"}, {"espctl", "sa", "list"}, {"espctl", "policy", "list"}, {"espctl", "stats"}} {
				out, _ := bed.gw[name].run(nil, argv...)
				t.Logf("gateway %s: %s:\n%s", name, strings.Join(argv, " "), out)
			}
			t.Logf("gateway %s: routes and rules:\n%s", name, bed.holds(t, name))
		}
		for _, n := range []*testbed.Node{bed.top.Client, bed.top.GwA, bed.top.GwB, bed.top.Server} {
			out, _ := n.Run(t.Context(), "sh", "-c", "ip addr; ip -4 route; ip -6 route; ip neigh")
			t.Logf("%s:\n%s", n.Role, out)
		}
		bed.logLANs(t)
		for _, p := range pingers {
			t.Logf("%s: ping %s", p.name, p.state())
		}
		t.Fatalf("%s: the tunnel was not back within 60 s (up in espd on both gateways: %v)", ev.name, !up.IsZero())
	}
	ev.recovered = time.Now()
}

// logLANs logs what the LAN links carry for 2 s at each end, and the
// neighbour tables and counters of the four namespaces: whether a LAN host
// still sends and whether its gateway hears it.
func (bed *packageBed) logLANs(t *testing.T) {
	t.Helper()
	ends := []struct {
		n      *testbed.Node
		ifname string
	}{{bed.top.Client, "eth0"}, {bed.top.GwA, testbed.IfLAN}, {bed.top.GwB, testbed.IfLAN}, {bed.top.Server, "eth0"}}
	out := make([]string, len(ends))
	var wg sync.WaitGroup
	for i, e := range ends {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			o, _ := e.n.Run(ctx, "sh", "-c", "timeout 2 tcpdump -enli "+e.ifname+" -c 20 2>&1; ip -s -s neigh; ip -s link show "+e.ifname)
			out[i] = o
		}()
	}
	wg.Wait()
	for i, e := range ends {
		t.Logf("%s %s:\n%s", e.n.Role, e.ifname, testbed.Tail(out[i], 40))
	}
}
