package e2e

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// TestMismatchedKeys gives gwB's inbound state another key than the one gwA
// encrypts with: nothing from the client reaches the server, and gwB counts
// an integrity failure for every packet while its state counts none as
// delivered.
func TestMismatchedKeys(t *testing.T) {
	for _, suite := range []string{"aes128gcm16", "aes256-sha1"} {
		t.Run(suite, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			tn := newTunnel(t, tunnelOpts{suite: suite, inner: []testbed.Family{testbed.IPv4}, mismatch: true})
			rx, err := tn.top.Server.ListenUDP(netip.AddrPortFrom(serverAddr(testbed.IPv4), 0))
			if err != nil {
				t.Fatal(err)
			}
			defer rx.Close()
			capt, err := tn.top.GwB.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 64})
			if err != nil {
				t.Fatal(err)
			}
			const datagrams = 20
			sent, err := tn.top.Client.SendUDP(ctx, rx.Addr(), testbed.UDPSendOptions{Size: 200, Count: datagrams, Interval: 5 * time.Millisecond})
			if err != nil || sent != datagrams {
				t.Fatalf("sent %d: %v", sent, err)
			}
			r, err := tn.top.Client.Ping(ctx, serverAddr(testbed.IPv4), testbed.PingOptions{Count: 3, Wait: 500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			if r.Received != 0 {
				t.Errorf("ping answered through mismatched keys:\n%s", r.Output)
			}
			var integ uint64
			if !eventually(5*time.Second, func() bool {
				integ = tn.b.saCounter(t, spiAB, tn.bOuter, cntIntegrity...)
				return integ >= datagrams+3
			}) {
				t.Errorf("gwB counted %d integrity failures for %d packets", integ, datagrams+3)
			}
			res, err := capt.Stop()
			if err != nil {
				t.Fatal(err)
			}
			var esp uint64
			for _, f := range res.Frames {
				if !f.Outgoing && f.Class == testbed.ClassESP && f.SPI == spiAB {
					esp++
				}
			}
			if integ != esp {
				t.Errorf("gwB received %d ESP packets of 0x%x and counted %d integrity failures", esp, spiAB, integ)
			}
			if got := rx.Packets(); got != 0 {
				t.Errorf("server received %d datagrams through mismatched keys", got)
			}
			if n := tn.b.saCounter(t, spiAB, tn.bOuter, cntPackets...); n != 0 {
				t.Errorf("gwB's inbound state counts %d packets delivered", n)
			}
			t.Logf("gwB: %d integrity failures for %d ESP packets (%d datagrams and 3 echo requests sent)", integ, esp, datagrams)
			tn.b.alive(t)
		})
	}
}
