package tun_test

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
	"github.com/espd/espd/tun"
)

// TestReadBatchesSuperPackets queues several UDP GSO super-packets of
// different flows before reading, as many TCP senders interleave short
// trains, and expects one Read to return the segments of all of them in
// order, not one super-packet per call.
func TestReadBatchesSuperPackets(t *testing.T) {
	ns := testbed.NewNodeT(t, "tun")
	// No IPv6 on the device: no router solicitation or MLD report comes
	// first and takes the small-packet path.
	if err := ns.Sysctl("net/ipv6/conf/default/disable_ipv6", "1"); err != nil {
		t.Fatal(err)
	}
	dev := createIn(t, ns, tun.Config{Name: "esptest9"})
	ns.MustIP(t, "addr", "add", "198.18.107.1/32", "dev", "lo")
	ns.MustIP(t, "route", "add", "198.18.108.0/24", "dev", "esptest9", "src", "198.18.107.1")
	conn := udpConnIn(t, ns, "udp4")
	const flows, segs, seg = 4, 3, 400
	before := dev.Stats()
	for f := range flows {
		payload := make([]byte, segs*seg)
		for i := range payload {
			payload[i] = byte(f*segs + i/seg)
		}
		raddr := net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr("198.18.108.9"), uint16(7000+f)))
		if _, _, err := conn.WriteMsgUDP(payload, udpSegment(seg), raddr); err != nil {
			t.Fatalf("GSO send %d: %v", f, err)
		}
	}
	const off = 80
	rb := make([][]byte, dev.BatchSize())
	sizes := make([]int, len(rb))
	for i := range rb {
		rb[i] = make([]byte, off+dev.MTU())
	}
	deadline := time.AfterFunc(5*time.Second, func() { dev.Close() })
	defer deadline.Stop()
	var got []byte // each segment's first payload byte, in the order read
	reads := 0
	for len(got) < flows*segs {
		k, err := dev.Read(rb, sizes, off)
		if err != nil {
			t.Fatalf("after %d segments: %v", len(got), err)
		}
		ours := 0
		for i := range k {
			p := rb[i][off : off+sizes[i]]
			if port := udpDstPort(p); port >= 7000 && port < 7000+flows {
				got = append(got, p[len(p)-seg])
				ours++
			}
		}
		if ours > 0 {
			reads++
		}
	}
	for i, b := range got {
		if b != byte(i) {
			t.Fatalf("segment %d carries segment %d's bytes (order %v)", i, b, got)
		}
	}
	if reads != 1 {
		t.Errorf("%d Reads returned the %d queued super-packets' segments, want 1", reads, flows)
	}
	if s := dev.Stats(); s.SuperReads-before.SuperReads != flows {
		t.Errorf("%d super-packets read, want %d (the kernel did not hand the TUN UDP GSO super-packets)", s.SuperReads-before.SuperReads, flows)
	}
}
