package strongswantest

import (
	"context"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

var (
	keyRE  = regexp.MustCompile(`(\d+)\[CHD\] (encryption|integrity) (initiator|responder) key => (\d+) bytes`)
	dumpRE = regexp.MustCompile(`(\d+)\[CHD\]\s+\d+: ((?:[0-9A-F]{2} )+)`)
)

// childKeys returns the CHILD_SA keys charon logged (filelog chd = 4), in
// order, as hex.
func childKeys(log string) []string {
	var keys []string
	lines := strings.Split(log, "\n")
	for i := 0; i < len(lines); i++ {
		m := keyRE.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		thread := m[1]
		want, _ := strconv.Atoi(m[4])
		var key []byte
		for j := i + 1; j < len(lines) && len(key) < want; j++ {
			d := dumpRE.FindStringSubmatch(lines[j])
			if d == nil || d[1] != thread {
				continue
			}
			b, err := hex.DecodeString(strings.ReplaceAll(strings.TrimSpace(d[2]), " ", ""))
			if err != nil {
				break
			}
			key = append(key, b...)
		}
		if len(key) == want {
			keys = append(keys, m[2]+" "+hex.EncodeToString(key))
		}
	}
	return keys
}

// TestEspdRestart kills gateway A's espd with SIGKILL in the middle of a
// transfer and starts it again: charon keeps running and says why, the
// plugin reconnects, reinstalls the policies and has charon replace the
// CHILD_SA that died with espd; traffic resumes with new SPIs within a
// bound the test measures, the transfer completes intact, and no key is
// ever used for two SAs (charon logs every CHILD_SA key at chd level 4).
// Gateway A's main table has a default route towards B, as a real
// gateway's has, and a capture of its transit link over the whole sequence
// shows not one cleartext packet of the LANs: the policy charon holds
// stays in force while espd is away (fail closed).
func TestEspdRestart(t *testing.T) {
	espdRestart(t, "SIGKILL", (*gateway).killEspd)
}

// TestEspdRestartSIGTERM is TestEspdRestart with espd stopped by SIGTERM,
// the orderly stop, while charon still holds the policies: no cleartext
// either, and the restart works the same.
func TestEspdRestartSIGTERM(t *testing.T) {
	espdRestart(t, "SIGTERM", (*gateway).termEspd)
}

// termEspd stops espd with SIGTERM and requires a clean exit.
func (g *gateway) termEspd() {
	g.t.Helper()
	if err := g.espd.Stop(10 * time.Second); err != nil {
		g.t.Fatalf("espd on %s: SIGTERM: %v\n%s", g.name, err, tail(g.espd.Log(), 40))
	}
}

// espdRestart is TestEspdRestart with stop taking espd on A down.
func espdRestart(t *testing.T, how string, stop func(*gateway)) {
	requireStrongSwan(t)
	p := newPair(t, pairOptions{A: charonOptions{Log: "chd = 4"}})
	ctx := context.Background()
	for _, args := range [][]string{
		{"-4", "route", "add", "default", "via", testbed.GwBTransitV4.Addr().String()},
		{"-6", "route", "add", "default", "via", testbed.GwBTransitV6.Addr().String()},
	} {
		if _, err := p.topo.GwA.IP(ctx, args...); err != nil {
			t.Fatal(err)
		}
	}
	p.load(v4("aes256gcm16"))
	p.initiate()
	before, _ := p.a.installedChild("net")
	oldSPIs := p.a.espdSPIs()
	capture, err := p.topo.GwA.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 256})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if capture != nil {
			capture.Stop()
		}
	}()

	type result struct {
		res testbed.TransferResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		// 24 MB at 2 MB/s: it runs through the outage.
		res, err := testbed.Transfer(context.Background(), testbed.TransferOptions{
			From: p.topo.Client, To: p.topo.Server, Dst: testbed.ServerV4.Addr(),
			Bytes: 24 << 20, MaxRate: 2 << 20, Timeout: 90 * time.Second, Seed: 7,
		})
		done <- result{res, err}
	}()
	time.Sleep(3 * time.Second)

	killed := time.Now()
	stop(p.a)
	if !waitFor(5*time.Second, func() bool { return p.a.charonLogCount("espd: lost the connection to espd") > 0 }) {
		t.Errorf("A: charon did not log losing espd")
	}
	time.Sleep(time.Second) // espd stays away for a moment
	if done, err := p.a.charon.Exited(); done {
		t.Fatalf("A: charon exited while espd was down: %v", err)
	}
	p.a.runEspd()
	restarted := time.Now()

	// A new CHILD_SA with new SPIs, installed in the new espd.
	var after childSA
	if !waitFor(30*time.Second, func() bool {
		c, ok := p.a.installedChild("net")
		if !ok || c.SPIOut == before.SPIOut || c.SPIIn == before.SPIIn {
			return false
		}
		spis := p.a.espdSPIs()
		after = c
		return len(spis["out"]) == 1 && spis["out"][0] == c.SPIOut
	}) {
		t.Fatalf("A: no new CHILD_SA in the new espd within 30 s: charon %+v, espd %v", after, p.a.espdSPIs())
	}
	newSA := time.Since(restarted)
	// Traffic resumes.
	resumed := waitFor(30*time.Second, func() bool {
		r, err := p.topo.Client.Ping(ctx, testbed.ServerV4.Addr(), testbed.PingOptions{Count: 1, Wait: 500 * time.Millisecond})
		return err == nil && r.OK()
	})
	resume := time.Since(restarted)
	if !resumed {
		t.Fatalf("no traffic through the tunnel within 30 s of espd's restart")
	}
	t.Logf("%s: espd down for %v; after its restart a new CHILD_SA (SPIs %s_i %s_o, were %s_i %s_o) was installed in %v and pings crossed after %v",
		how, restarted.Sub(killed).Round(time.Millisecond), after.SPIIn, after.SPIOut, before.SPIIn, before.SPIOut,
		newSA.Round(time.Millisecond), resume.Round(time.Millisecond))
	for _, spi := range append(p.a.espdSPIs()["in"], p.a.espdSPIs()["out"]...) {
		for _, old := range append(oldSPIs["in"], oldSPIs["out"]...) {
			if spi == old {
				t.Errorf("A: the new espd has the old SPI %s", spi)
			}
		}
	}
	if n := p.a.charonLogCount("died with espd", "hard expire"); n == 0 {
		t.Errorf("A: the plugin did not report the SAs that died with espd")
	}

	r := <-done
	if r.err != nil {
		t.Fatalf("transfer across the restart: %v (%v)", r.err, r.res)
	}
	t.Logf("transfer across the restart: %v", r.res)
	res := stopCaptureNoLeaks(t, capture, fmt.Sprintf("A's transit link across the %s and restart (espd down from %s)", how, killed.Format("15:04:05.000")))
	capture = nil
	var espBefore, espAfter int
	for i := range res.Frames {
		if f := &res.Frames[i]; f.Outgoing && (f.Class == testbed.ClassESP || f.Class == testbed.ClassESPInUDP) {
			if f.Time.Before(killed) {
				espBefore++
			} else if f.Time.After(restarted) {
				espAfter++
			}
		}
	}
	if espBefore == 0 || espAfter == 0 {
		t.Errorf("ESP from A: %d frames before espd went down, %d after it was back; want some of each", espBefore, espAfter)
	}

	// Every CHILD_SA got fresh keys: no key appears twice.
	keys := childKeys(p.a.charon.Log())
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k] {
			t.Errorf("A: a key was derived for two SAs: %s", k)
		}
		seen[k] = true
	}
	if len(keys) < 4 {
		t.Fatalf("A: %d CHILD_SA keys in charon's log, want those of at least two CHILD_SAs", len(keys))
	}
	t.Logf("A: %d CHILD_SA keys logged, all distinct", len(keys))
}

// TestEspdRestartDebianTimers keeps charon's default retransmit settings
// (Debian's: 4 s, base 1.8), takes gateway A's espd away with SIGKILL, for
// 10 s and then for 12.5 s, and measures, from the moment the new espd
// answers on its socket with its TUN up, how long until the first ping
// crosses the tunnel again. While espd is away its TUN disappears and
// charon starts a MOBIKE address update that cannot get out; charon sends
// it again 4, 11.2 and 24.2 s after the first try, and the CHILD_SA
// replacement waits behind it, so without help the gap depends on where
// espd's return falls between those retransmits (about 1 s after 10 s
// away, about 11 s after 12.5 s). The plugin holds the IKE packets charon
// sends meanwhile and sends them the moment the hand-off is back: the gap
// must stay under 2 s after either outage.
func TestEspdRestartDebianTimers(t *testing.T) {
	requireStrongSwan(t)
	p := newPair(t, pairOptions{A: charonOptions{DebianTimers: true}, B: charonOptions{DebianTimers: true}})
	p.load(v4("aes256gcm16"))
	p.initiate()
	ctx := context.Background()
	for i, outage := range []time.Duration{10 * time.Second, 12500 * time.Millisecond} {
		if r, err := p.topo.Client.Ping(ctx, testbed.ServerV4.Addr(), testbed.PingOptions{Count: 3}); err != nil || !r.OK() {
			t.Fatalf("pings through the tunnel before restart %d: %v\n%s", i+1, err, r.Output)
		}
		held := p.a.charonLogCount("espd: sent", "IKE packets charon sent while espd was away")
		p.a.killEspd()
		killed := time.Now()
		time.Sleep(outage)
		p.a.runEspd()
		back := time.Now()
		var first time.Time
		for time.Since(back) < 40*time.Second {
			r, err := p.topo.Client.Ping(ctx, testbed.ServerV4.Addr(), testbed.PingOptions{Count: 1, Wait: 200 * time.Millisecond})
			if err == nil && r.OK() {
				first = time.Now()
				break
			}
		}
		if first.IsZero() {
			t.Fatalf("no ping crossed the tunnel within 40 s of espd's restart (espd was away %v)", back.Sub(killed).Round(time.Millisecond))
		}
		gap := first.Sub(back)
		t.Logf("espd away %v; first ping through %v after the new espd was up; the plugin sent held IKE packets: %v",
			back.Sub(killed).Round(time.Millisecond), gap.Round(time.Millisecond),
			p.a.charonLogCount("espd: sent", "IKE packets charon sent while espd was away") > held)
		if gap > 2*time.Second {
			t.Errorf("after %v away: traffic resumed %v after espd was back, want at most 2 s", outage, gap.Round(time.Millisecond))
		}
	}
	var why []string
	for _, l := range strings.Split(p.a.charon.Log(), "\n") {
		if strings.Contains(l, "MOBIKE") || strings.Contains(l, "retransmit") || strings.Contains(l, "interface esp0") ||
			strings.Contains(l, "espd: sent") || strings.Contains(l, "connected to espd") || strings.Contains(l, "hand-off") {
			why = append(why, l)
		}
	}
	t.Logf("A's charon on its TUN, MOBIKE, retransmits and espd:\n%s", strings.Join(why, "\n"))
}
