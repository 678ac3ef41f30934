package tun_test

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/espd/espd/testbed"
	"github.com/espd/espd/tun"
)

// TestTxQueueLen checks the transmit queue's length, default and chosen,
// and the refused ones.
func TestTxQueueLen(t *testing.T) {
	ns := testbed.NewNodeT(t, "tun")
	createIn(t, ns, tun.Config{Name: "esptest5"})
	if out := ns.MustIP(t, "-o", "link", "show", "esptest5"); !strings.Contains(out, "qlen 1000") {
		t.Errorf("default: %q, want qlen %d", out, tun.DefaultTxQueueLen)
	}
	createIn(t, ns, tun.Config{Name: "esptest6", TxQueueLen: 3000})
	if out := ns.MustIP(t, "-o", "link", "show", "esptest6"); !strings.Contains(out, "qlen 3000") {
		t.Errorf("TxQueueLen 3000: %q", out)
	}
	for _, n := range []int{-1, tun.MaxTxQueueLen + 1} {
		if _, err := tun.Create(tun.Config{Name: "esptest7", TxQueueLen: n}); err == nil || !strings.Contains(err.Error(), "txqueuelen") {
			t.Errorf("TxQueueLen %d: %v, want refused", n, err)
		}
	}
}

// TestQueueDrops fills a short transmit queue that nobody reads and
// expects Stats to count what the kernel dropped, and nothing before.
func TestQueueDrops(t *testing.T) {
	ns := testbed.NewNodeT(t, "tun")
	const qlen, sent = 8, 100
	dev := createIn(t, ns, tun.Config{Name: "esptest8", TxQueueLen: qlen})
	ns.MustIP(t, "addr", "add", "198.18.103.1/32", "dev", "lo")
	ns.MustIP(t, "route", "add", "198.18.104.0/24", "dev", "esptest8", "src", "198.18.103.1")
	if d := dev.Stats().QueueDrops; d != 0 {
		t.Fatalf("QueueDrops %d before any packet", d)
	}
	conn := udpConnIn(t, ns, "udp4")
	raddr := net.UDPAddrFromAddrPort(netip.MustParseAddrPort("198.18.104.9:7777"))
	for i := range sent {
		if _, err := conn.WriteToUDP([]byte{byte(i)}, raddr); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	// The queue holds qlen packets; the kernel may queue a few more in
	// the qdisc's own handoff, never the rest.
	if d := dev.Stats().QueueDrops; d < sent-2*qlen || d > sent {
		t.Errorf("QueueDrops %d after %d packets into a queue of %d nobody read", d, sent, qlen)
	}
	// Reading drains the queue: what was kept arrives, the drops stay.
	got := readUntil(t, dev, func(p []byte) bool { return udpDstPort(p) == 7777 })
	if len(got) == 0 || len(got) > 2*qlen {
		t.Errorf("read %d queued packets, want 1..%d", len(got), 2*qlen)
	}
}
