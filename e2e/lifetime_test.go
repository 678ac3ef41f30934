package e2e

import (
	"bytes"
	"context"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startMonitor runs "espctl monitor --json" against e until the test ends.
func startMonitor(t *testing.T, e *espd) *syncBuffer {
	t.Helper()
	out := &syncBuffer{}
	cmd := exec.Command(espctlBin, "-s", e.sock, "--json", "monitor")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	// Subscribed once it is connected and still running; give it a moment.
	time.Sleep(500 * time.Millisecond)
	select {
	case <-exited:
		t.Fatalf("espctl monitor exited at once:\n%s", out.String())
	default:
	}
	return out
}

// hardExpire reports whether the monitor output holds a hard-expire event
// of spi (one JSON object per event, cmd/espctl/json.go).
func hardExpire(out string, spi uint32) bool {
	for line := range strings.SplitSeq(out, "\n") {
		v, err := decodeJSON(line)
		if err != nil {
			continue
		}
		ev, ok := v.(map[string]any)
		if !ok || ev["type"] != "hard-expire" {
			continue
		}
		if n, err := jsonCounter(ev, "spi"); err == nil && uint32(n) == spi {
			return true
		}
	}
	return false
}

// TestHardLifetime gives gwA's outbound state a hard limit of 100 kB: after
// about that much traffic the state is gone, "espctl monitor" has shown
// the hard-expire event, and traffic no longer crosses.
func TestHardLifetime(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const limit = 100_000
	tn := newTunnel(t, tunnelOpts{inner: []testbed.Family{testbed.IPv4}, hardBytes: limit})
	mon := startMonitor(t, tn.a)
	ping(t, ctx, tn.top, testbed.IPv4, false)

	rx, err := tn.top.Server.ListenUDP(netip.AddrPortFrom(serverAddr(testbed.IPv4), 0))
	if err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	// 300 datagrams of 1000 bytes: three times the limit.
	const size, count = 1000, 300
	if _, err := tn.top.Client.SendUDP(ctx, rx.Addr(), testbed.UDPSendOptions{Size: size, Count: count, Interval: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if !eventually(10*time.Second, func() bool { return hardExpire(mon.String(), spiAB) }) {
		t.Fatalf("no hard-expire event for 0x%x from espctl monitor:\n%s", spiAB, tail(mon.String(), 20))
	}
	if out, err := tn.a.ctl(saGetArgs("get", spiAB, tn.bOuter)...); err == nil {
		t.Errorf("the expired state is still there:\n%s", out)
	}
	got := int(rx.Packets())
	// The state counts inner bytes: 1028 per datagram (IPv4 and UDP
	// headers), 84 per echo request. About limit/1028 datagrams fit.
	if fit := limit / (size + 28); got < fit-3 || got > fit+1 {
		t.Errorf("%d datagrams of %d crossed a hard limit of %d bytes; about %d fit", got, count, limit, fit)
	}
	t.Logf("%d of %d datagrams crossed before the state expired", got, count)
	r, err := tn.top.Client.Ping(ctx, serverAddr(testbed.IPv4), testbed.PingOptions{Count: 2, Wait: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if r.Received != 0 {
		t.Errorf("ping still crosses after the hard expire:\n%s", r.Output)
	}
	tn.a.alive(t)
}
