package packaging

import (
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// childSPIs returns the SPIs (in, out; 8 hex digits) of every CHILD_SA
// that the gateway's charon has installed.
func (bed *packageBed) childSPIs(t *testing.T, name string) [][2]string {
	t.Helper()
	var spis [][2]string
	for _, m := range spisRE.FindAllStringSubmatch(bed.gw[name].must(t, "swanctl", "--list-sas", "--raw"), -1) {
		spis = append(spis, [2]string{m[1], m[2]})
	}
	return spis
}

// rekey rekeys the CHILD_SA from the gateway's charon (swanctl --rekey
// --child lan) under the pingers' traffic, and checks: the rekey completes
// (each gateway's charon has one installed CHILD_SA, with new SPIs, the
// two agree, espd holds the new SAs and no longer the old ones, within
// 30 s); the new SPIs carry the traffic both ways on the transit link and
// the old ones are not seen there once espd has let them go; and in each
// of the pingers' directions at most one request went unanswered among
// those sent from the command to 1 s after espd let the old SAs go (by
// icmp_seq, from the last request answered before the command: a gap in
// the replies of at most one ping interval and one round trip). Cleartext
// is counted for the whole test.
func (bed *packageBed) rekey(t *testing.T, ev *lifecycleEvent, caps *transitCaptures, pingers []*pinger, name string) {
	t.Helper()
	old := map[string][2]string{}
	for _, gw := range []string{"A", "B"} {
		s := bed.childSPIs(t, gw)
		if len(s) != 1 {
			t.Fatalf("gateway %s before the rekey: installed CHILD_SAs %q, want one", gw, s)
		}
		old[gw] = s[0]
	}
	bed.gw[name].must(t, "swanctl", "--rekey", "--child", "lan")
	now := map[string][2]string{}
	if !testbed.Poll(30*time.Second, 100*time.Millisecond, func() bool {
		for _, gw := range []string{"A", "B"} {
			s := bed.childSPIs(t, gw)
			if len(s) != 1 || s[0][0] == old[gw][0] || s[0][1] == old[gw][1] {
				return false
			}
			now[gw] = s[0]
			list, err := bed.gw[gw].run(nil, "espctl", "sa", "list")
			if err != nil {
				return false
			}
			for i := range 2 {
				if !strings.Contains(list, "spi 0x"+now[gw][i]+" ") || strings.Contains(list, "spi 0x"+old[gw][i]+" ") {
					return false
				}
			}
		}
		return true
	}) {
		for _, gw := range []string{"A", "B"} {
			out, _ := bed.gw[gw].run(nil, "sh", "-c", "swanctl --list-sas; espctl sa list")
			t.Logf("gateway %s:\n%s", gw, out)
		}
		t.Fatalf("%s: the rekey did not complete within 30 s (SPIs before: %v)", ev.name, old)
	}
	gone := time.Now()
	if now["A"][0] != now["B"][1] || now["A"][1] != now["B"][0] {
		t.Errorf("%s: the gateways disagree on the new CHILD_SA: A in/out %v, B in/out %v", ev.name, now["A"], now["B"])
	}
	to := gone.Add(time.Second)
	if !waitPassing(pingers, to, 30*time.Second) {
		t.Fatalf("%s: no traffic both ways after the rekey", ev.name)
	}

	// On the wire, at A's end: A's outbound SPI on what A sends, its
	// inbound one on what it receives.
	want := map[bool]uint32{true: spiOf(now["A"][1]), false: spiOf(now["A"][0])}
	stale := map[bool]uint32{true: spiOf(old["A"][1]), false: spiOf(old["A"][0])}
	seen := map[bool]int{}
	for _, f := range caps.frames("A") {
		if f.Class != testbed.ClassESP && f.Class != testbed.ClassESPInUDP {
			continue
		}
		if f.SPI == want[f.Outgoing] && f.Time.After(ev.start) {
			seen[f.Outgoing]++
		}
		if f.SPI == stale[f.Outgoing] && f.Time.After(gone) {
			t.Errorf("%s: ESP with the old SPI %08x at %s, after espd let it go (%s)", ev.name, f.SPI, f.Time.Format("15:04:05.000"), gone.Format("15:04:05.000"))
		}
	}
	if seen[true] == 0 || seen[false] == 0 {
		t.Errorf("%s: ESP frames with the new SPIs at A's end: %d out (%s), %d in (%s), want both", ev.name, seen[true], now["A"][1], seen[false], now["A"][0])
	}
	var log strings.Builder
	for _, p := range pingers {
		missed, answered, ok := p.missed(ev.start, to)
		fmt.Fprintf(&log, "\n  %-28s %d answered, %d unanswered", p.name, answered, missed)
		if !ok {
			t.Errorf("%s: %s: the window is not bounded by answered requests of one ping", ev.name, p.name)
		} else if missed > 1 {
			t.Errorf("%s: %s: %d requests unanswered across the rekey, want at most 1", ev.name, p.name, missed)
		}
	}
	t.Logf("%s: SPIs A in/out %v -> %v, in %v; ESP with the new SPIs at A's end: %d out, %d in; requests sent from the rekey to 1 s after:%s",
		ev.name, old["A"], now["A"], gone.Sub(ev.start).Round(10*time.Millisecond), seen[true], seen[false], log.String())
}

// spiOf parses 8 hex digits.
func spiOf(s string) uint32 {
	var v uint32
	fmt.Sscanf(s, "%08x", &v)
	return v
}

// removePlugin runs `apt-get remove strongswan-espd` on the gateway under
// the pingers' traffic and checks what the package leaves: espd installed
// and its unit running on, the plugin's package removed (its conffile
// kept) and the same charon running, with the plugin it loaded: it has no
// prerm or postrm that would restart charon.
func (bed *packageBed) removePlugin(t *testing.T, name string) {
	t.Helper()
	c := bed.gw[name]
	before := c.show(t, "strongswan.service", "MainPID")
	espd := c.show(t, "espd-ike.service", "MainPID")
	aptGet(t, c, "/", "apt-get remove strongswan-espd")
	if out, _ := c.run(nil, "dpkg-query", "-W", "-f", "${db:Status-Abbrev}|", "espd", "strongswan-espd"); out != "ii |rc |" {
		t.Errorf("gateway %s: after apt-get remove strongswan-espd: %q, want espd installed, the plugin removed", name, out)
	}
	if p := c.show(t, "espd-ike.service", "MainPID", "ActiveState"); p["MainPID"] != espd["MainPID"] || p["ActiveState"] != "active" {
		t.Errorf("gateway %s: apt-get remove strongswan-espd: espd-ike.service %v, was %v: want the same espd", name, p, espd)
	}
	if p := c.show(t, "strongswan.service", "MainPID", "ActiveState"); p["MainPID"] != before["MainPID"] || p["ActiveState"] != "active" {
		t.Errorf("gateway %s: apt-get remove strongswan-espd: strongswan.service %v, was %v: want the same charon", name, p, before)
	}
	if plugins := loadedPlugins(t, c); !strings.Contains(plugins, " espd ") {
		t.Errorf("gateway %s: strongswan-espd removed: the running charon has no espd plugin: %s", name, plugins)
	}
}

// pluginReinstalled removes strongswan-espd from the gateway
// (removePlugin), checks that the tunnel still passes both ways 2 s
// later, and installs the package again: its postinst restarts the
// running charon, which loads the plugin again. The events' bound on the
// time without a reply counts from the removal.
func (bed *packageBed) pluginReinstalled(t *testing.T, ev *lifecycleEvent, pingers []*pinger, name string) {
	t.Helper()
	bed.removePlugin(t, name)
	removed := time.Now()
	if !waitPassing(pingers, removed.Add(2*time.Second), 30*time.Second) {
		t.Errorf("gateway %s: strongswan-espd removed, charon not restarted: the tunnel stopped", name)
	}
	before := bed.gw[name].show(t, "strongswan.service", "MainPID")
	aptGet(t, bed.gw[name], "/mnt/espd", "apt-get install ./"+bed.pluginDeb)
	if p := bed.gw[name].show(t, "strongswan.service", "MainPID", "ActiveState"); p["MainPID"] == before["MainPID"] || p["ActiveState"] != "active" {
		t.Errorf("gateway %s: strongswan-espd installed again: strongswan.service %v, was %v: want restarted", name, p, before)
	}
	if plugins := loadedPlugins(t, bed.gw[name]); !strings.Contains(plugins, " espd ") {
		t.Errorf("gateway %s: strongswan-espd installed again: charon has no espd plugin loaded: %s", name, plugins)
	}
}

// pluginRemovedRestart removes strongswan-espd from the gateway
// (removePlugin) and then restarts its charon, as its next start or a
// boot would. That charon does not start: without the plugin it has no
// IKE socket (espd owns the ports, socket-default is off) and its
// critical features fail ("unmet dependency: CUSTOM:socket"). The charon
// that stopped left the remote prefixes as drop policies in espd; not one
// request sent after the restart is answered for 10 s. Then the package is
// installed again; its postinst starts strongswan.service again, enabled
// and failed as it is, with the plugin. ev.t0 is the end of the
// reinstall, from when the tunnel must be back within the events' bound.
func (bed *packageBed) pluginRemovedRestart(t *testing.T, ev *lifecycleEvent, pingers []*pinger, name string) {
	t.Helper()
	c := bed.gw[name]
	bed.removePlugin(t, name)
	out, err := c.run(nil, "systemctl", "restart", "strongswan")
	restarted := time.Now()
	if p := c.show(t, "strongswan.service", "ActiveState"); err == nil || p["ActiveState"] == "active" {
		t.Errorf("gateway %s: charon restarted without the plugin: %v %s, strongswan.service %v: want it failed", name, err, out, p)
	}
	remote := map[string][]netip.Prefix{"A": {testbed.LANBV4, testbed.LANBV6}, "B": {testbed.LANAV4, testbed.LANAV6}}[name]
	pol := c.must(t, "espctl", "policy", "list")
	for _, r := range remote {
		if !regexp.MustCompile(`dst ` + regexp.QuoteMeta(r.String()) + `[^\n]*\n\tdir out action drop`).MatchString(pol) {
			t.Errorf("gateway %s: charon stopped, not restarted: no drop policy for %s in espd:\n%s", name, r, pol)
		}
	}
	if !testbed.Poll(30*time.Second, 200*time.Millisecond, func() bool {
		for _, p := range pingers {
			if p.update(); !p.sentAfter(restarted.Add(10 * time.Second)) {
				return false
			}
		}
		return true
	}) {
		t.Errorf("the pingers did not send for 10 s after charon's restart")
	}
	for _, p := range pingers {
		if n := p.repliesSince(restarted); n > 0 {
			t.Errorf("gateway %s: %s: %d replies to requests sent after charon failed to start without the plugin", name, p.name, n)
		}
	}
	journal := c.must(t, "journalctl", "--no-pager", "-o", "cat", "-u", "strongswan", "-n", "12")
	t.Logf("gateway %s: charon restarted without the plugin: %v; espd's policies:\n%s\ncharon's journal:\n%s", name, err, pol, journal)

	aptGet(t, c, "/mnt/espd", "apt-get install ./"+bed.pluginDeb)
	ev.t0 = time.Now()
	if p := c.show(t, "strongswan.service", "ActiveState"); p["ActiveState"] != "active" {
		t.Errorf("gateway %s: strongswan-espd installed again: strongswan.service %v, want the postinst to have started it", name, p)
		c.must(t, "systemctl", "start", "strongswan")
	}
	if plugins := loadedPlugins(t, c); !strings.Contains(plugins, " espd ") {
		t.Errorf("gateway %s: strongswan-espd installed again: charon has no espd plugin loaded: %s", name, plugins)
	}
}

// captureReport logs what the transit captures saw at each end during
// each event (from its start to the next one's), and checks each boot:
// from the power-off until the tunnel was back, not one cleartext frame
// at either end, and the rebooted gateway's own end (captured since
// before its container started, across its link down and up) saw the IKE
// of the boot.
func captureReport(t *testing.T, events []*lifecycleEvent, results []captureResult, end time.Time) {
	t.Helper()
	var b strings.Builder
	for i, ev := range events {
		to := end
		if i+1 < len(events) {
			to = events[i+1].start
		}
		fmt.Fprintf(&b, "\n  %s:", ev.name)
		for _, r := range results {
			fmt.Fprintf(&b, "\n    %s: %s", r.side, counts(r.res, ev.start, to))
			if ev.rebooted == "" || ev.recovered.IsZero() {
				continue
			}
			boot := counts(r.res, ev.start, ev.recovered)
			fmt.Fprintf(&b, "\n      power-off to tunnel back (%v): %s", ev.recovered.Sub(ev.start).Round(10*time.Millisecond), boot)
			if boot.leaks > 0 {
				t.Errorf("%s: %d cleartext frames %s between the power-off and the tunnel back", ev.name, boot.leaks, r.side)
			}
			if r.side == "at "+ev.rebooted {
				on := counts(r.res, ev.t0, ev.recovered)
				fmt.Fprintf(&b, "\n      power-on to tunnel back: %s", on)
				if on.class[testbed.ClassIKE] == 0 {
					t.Errorf("%s: the capture at the rebooted gateway's end saw no IKE between the power-on and the tunnel back: %s", ev.name, on)
				}
			}
		}
	}
	t.Logf("what the transit captures saw during each event:%s", b.String())
}
