package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

const metricsAddr = "127.0.0.1:9585"

// TestAFXDP runs the tunnel of TestFamilies with gwB receiving through
// AF_XDP (--xdp on the transit device): raw ESP over IPv4 and IPv6, and
// ESP-in-UDP with --xdp-udp (in native mode). Pings and transfers both ways arrive whole,
// only ESP crosses the transit link, and gwB's metrics show that the
// AF_XDP path, not a fallback, received nearly every packet. The capture
// is on gwA, which receives through its sockets: a capture on gwB does not
// see what XDP takes (docs/afxdp.md).
func TestAFXDP(t *testing.T) {
	for _, c := range []outerCase{
		{testbed.IPv4, false, "chacha20poly1305"},
		{testbed.IPv6, false, "aes128-sha256"},
		{testbed.IPv4, true, "aes128gcm16"},
	} {
		t.Run(c.name(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			args := []string{"--xdp=" + testbed.IfTransit, "--metrics-listen=" + metricsAddr}
			if c.encap {
				// Native: a veth with an XDP program in its driver has
				// gwA's UDP super-packets split before they cross; in
				// generic mode they cross whole, larger than a frame, and
				// go to the kernel's UDP_GRO socket (docs/afxdp.md).
				args = append(args, "--xdp-udp", "--xdp-mode=native")
			}
			tn := newTunnel(t, tunnelOpts{suite: c.suite, outer: c.outer, encap: c.encap, espdArgsB: args})
			gw := tn.top.GwB
			if v, err := scrapeMetric(gw, "espd_xdp_fallback"); err != nil || v != 0 {
				t.Fatalf("espd_xdp_fallback %v, %v (want 0: AF_XDP in use)", v, err)
			}
			capt, err := tn.top.GwA.StartCapture(testbed.IfTransit, testbed.CaptureOptions{})
			if err != nil {
				t.Fatal(err)
			}
			stopped := false
			defer func() {
				if !stopped {
					capt.Stop()
				}
			}()
			for _, inner := range []testbed.Family{testbed.IPv4, testbed.IPv6} {
				pingAndTransfer(t, ctx, tn.top, inner)
			}
			stopped = true
			res, err := capt.Stop()
			if err != nil {
				t.Fatal(err)
			}
			checkTransit(t, res, c.encap, 4*smallTransfer)
			frames, err1 := scrapeMetric(gw, "espd_xdp_frames_total")
			rx, err2 := scrapeMetric(gw, "espd_dataplane_rx_packets_total")
			dropped, _ := scrapeMetric(gw, "espd_xdp_dropped_total")
			if err1 != nil || err2 != nil {
				t.Fatalf("metrics: %v, %v", err1, err2)
			}
			t.Logf("gwB: %v of %v outer packets through AF_XDP, %v dropped on the way", frames, rx, dropped)
			// Only the packets before the state reached the program's map
			// (within 250 ms of its install) take the sockets.
			if frames < 0.9*rx || rx < 1000 {
				t.Errorf("gwB: %v of %v outer packets through AF_XDP, want at least 90%%", frames, rx)
			}
		})
	}
}

// TestAFXDPFallback: with --xdp naming a device espd cannot attach to,
// espd says why, exports espd_xdp_fallback 1 and carries the tunnel
// through its sockets.
func TestAFXDPFallback(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tn := newTunnel(t, tunnelOpts{espdArgsB: []string{"--xdp=" + testbed.IfTransit + ",nosuchdev", "--metrics-listen=" + metricsAddr}})
	if v, err := scrapeMetric(tn.top.GwB, "espd_xdp_fallback"); err != nil || v != 1 {
		t.Fatalf("espd_xdp_fallback %v, %v; want 1", v, err)
	}
	if log := tn.b.proc.Log(); !strings.Contains(log, "AF_XDP receive unavailable") || !strings.Contains(log, "nosuchdev") {
		t.Errorf("espd's log does not say why AF_XDP is off:\n%s", tail(log, 20))
	}
	ping(t, ctx, tn.top, testbed.IPv4, false)
	if _, err := transferErr(t, ctx, tn.top, testbed.IPv4, true, smallTransfer); err != nil {
		t.Fatal(err)
	}
	if v, err := scrapeMetric(tn.top.GwB, "espd_xdp_frames_total"); err != nil || v != 0 {
		t.Errorf("espd_xdp_frames_total %v, %v; want 0", v, err)
	}
}

// TestAFXDPKill: the program goes with espd. Killed (SIGKILL), espd
// leaves no XDP program on the transit device, so the kernel receives
// everything again; started again, it attaches anew.
func TestAFXDPKill(t *testing.T) {
	tn := newTunnel(t, tunnelOpts{espdArgsB: []string{"--xdp=" + testbed.IfTransit}})
	gw := tn.top.GwB
	attached := func() bool {
		out, err := gw.IP(context.Background(), "-d", "link", "show", testbed.IfTransit)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(out, "xdp")
	}
	if !attached() {
		t.Fatalf("no XDP program on %s while espd runs", testbed.IfTransit)
	}
	tn.b.kill(t)
	if !eventually(10*time.Second, func() bool { return !attached() }) {
		t.Fatalf("espd was killed and an XDP program is still on %s", testbed.IfTransit)
	}
	tn.b = startEspd(t, gw, "--xdp="+testbed.IfTransit)
	if !eventually(10*time.Second, attached) {
		t.Fatalf("espd restarted and attached no XDP program to %s", testbed.IfTransit)
	}
}

// scrapeMetric reads the unlabelled sample name from the /metrics of the
// espd in n (metricsAddr).
func scrapeMetric(n *testbed.Node, name string) (float64, error) {
	var body string
	err := n.Do(func() error {
		c, err := net.DialTimeout("tcp", metricsAddr, 10*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.WriteString(c, "GET /metrics HTTP/1.0\r\n\r\n"); err != nil {
			return err
		}
		b, err := io.ReadAll(c)
		body = string(b)
		return err
	})
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 2 && f[0] == name {
			return strconv.ParseFloat(f[1], 64)
		}
	}
	return 0, fmt.Errorf("no sample %s in %s's /metrics", name, n.Role)
}
