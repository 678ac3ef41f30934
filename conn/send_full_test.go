package conn

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSendFullBuffer fills the IPv4 raw socket's send buffer for real: a
// token bucket of 1 kbit/s on the link holds what one sender sends, so
// its Send waits in the poller for room. Another sender's IPv6 packets,
// on the other socket, leave meanwhile: it does not wait for the first.
func TestSendFullBuffer(t *testing.T) {
	a, _ := twoNS(t)
	if _, err := a.Run(context.Background(), "tc", "qdisc", "add", "dev", "va", "root",
		"tbf", "rate", "1kbit", "burst", "2000", "limit", "100000000"); err != nil {
		t.Skipf("no token bucket qdisc: %v", err)
	}
	sa := openIn(t, a, SocketConfig{Mark: testMark, EncapPort: 4508})
	a4, b4 := netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("198.18.1.2")
	a6, b6 := netip.MustParseAddr("2001:db8:1::1"), netip.MustParseAddr("2001:db8:1::2")

	sndbuf, outq := 0, 0
	queued := func() {
		sa.send.v4.rc.Control(func(fd uintptr) {
			sndbuf, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
			outq, _ = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ)
		})
	}
	// The stuck sender: far more than the buffer holds, in batches.
	stuck := make(chan error, 1)
	go func() {
		var pkts []Packet
		for range 64 {
			pkts = append(pkts, outPkt(a4, b4, 0, 0, 0, make([]byte, 1400)))
		}
		for range 64 {
			if _, err := sa.Send(pkts); err != nil {
				stuck <- err
				return
			}
		}
		stuck <- nil
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if queued(); sndbuf > 0 && outq > sndbuf/2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the IPv4 socket's buffer holds %d of %d bytes after 30 s", outq, sndbuf)
		}
	}

	done := make(chan error, 1)
	go func() {
		n, err := sa.Send([]Packet{outPkt(a6, b6, 0, 0, 0, make([]byte, 100)), outPkt(a6, b6, 0, 0, 0, make([]byte, 100))})
		if err == nil && n != 2 {
			err = unix.EIO
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("IPv6 Send: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the IPv6 sender waited 30 s for the one whose IPv4 buffer is full")
	}
	select {
	case err := <-stuck:
		t.Fatalf("the IPv4 sender finished (%v): its buffer never held it up, nothing was tested", err)
	default:
	}
	sa.Close() // wakes the stuck sender
	select {
	case <-stuck:
	case <-time.After(30 * time.Second):
		t.Fatal("the stuck sender did not return within 30 s of Close")
	}
}
