package daemon

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/sa"
	"github.com/espd/espd/testbed"
	"github.com/espd/espd/tun"
)

// movedElsewhere lists the series TestMetricsSeries cannot drive through a
// running daemon, each with the code that increments it and the test that
// proves it moves there. The test checks that the file holds the test
// function and names the counter.
var movedElsewhere = map[string]struct {
	counter   string // the code that increments the series
	file      string // the proving test's file, from the module root
	test      string // the proving test
	reference string // what that test reads: the counter's field
}{
	"espd_dataplane_icmp_sent_total": {"dataplane/pmtu.go icmpSender.tooBig, for a packet too big for the path",
		"dataplane/pmtu_test.go", "TestPathMTU", "ICMPSent"},
	"espd_dataplane_icmp_limited_total": {"dataplane/pmtu.go icmpSender.tooBig, when the rate limit holds the error back",
		"dataplane/pmtu_test.go", "TestICMPRateLimit", "ICMPLimited"},
	"espd_dataplane_fragments_total": {"dataplane/outbound.go Device.sendBatch, for an outer packet split in fragments",
		"dataplane/pmtu_test.go", "TestPathMTU", "Fragments"},
	"espd_dataplane_queue_drops_total": {"dataplane/outbound.go classifyOut and inbound.go classifyIn, when the workers' queue is full",
		"dataplane/pipeline_test.go", "TestQueueFullDropsWithoutBlocking", "QueueDrops"},
	"espd_dataplane_handed_off_total": {"dataplane/outbound.go classifyOut and inbound.go classifyIn, for a batch handed to the workers",
		"dataplane/pipeline_test.go", "TestOrderAcrossHandOff", "HandedOff"},
	"espd_dataplane_read_errors_total": {"dataplane/outbound.go readTUN and inbound.go readOuter, when a TUN or outer socket read fails",
		"dataplane/outer_test.go", "TestReadErrorsCounted", "ReadErrors"},
	"espd_dataplane_tun_super_reads_total": {"tun's Read of a TSO/USO super-packet (tun.Stats.SuperReads, copied by dataplane.Device.Stats)",
		"tun/offload_test.go", "TestCoalesceAndSplit", "SuperReads"},
	"espd_dataplane_tun_queue_drops_total": {"the kernel, when the TUN's transmit queue is full (tun.Stats.QueueDrops, the interface's tx_dropped, copied by dataplane.Device.Stats)",
		"tun/queue_test.go", "TestQueueDrops", "QueueDrops"},
	"espd_dataplane_tun_uring_enters_total": {"tun's Write of two or more writes through io_uring (tun.Stats.URingEnters, copied by dataplane.Device.Stats)",
		"tun/uring_internal_test.go", "TestURingEnterRefused", "URingEnters"},
	"espd_dataplane_tun_super_writes_total": {"tun's Write of a coalesced super-packet (tun.Stats.SuperWrites, copied by dataplane.Device.Stats)",
		"tun/offload_test.go", "TestCoalesceAndSplit", "SuperWrites"},
	"espd_dataplane_no_interface_total": {"dataplane/inbound.go classifyIn, for a packet of a state whose if_id no route-based interface has",
		"dataplane/interfaces_test.go", "TestInterfaces", "NoInterface"},
	"espd_cpu_aes": {"metrics/collector.go collector.Collect, from crypto.AESAccelerated when the daemon started",
		"metrics/cpu_test.go", "TestCPUAES", "GetGauge"},
	"espd_state_write_errors_total": {"daemon/statefiles.go Daemon.stateWriteFailed, when a write of the hold file or the interfaces record fails",
		"daemon/ifreload_test.go", "TestReloadInterfaceInPlace", "writes"},
	"espd_ike_read_errors_total": {"conn/ike_linux.go ikeRelay.read, when a read of an IKE-port socket fails",
		"conn/ike_linux_test.go", "TestIKEReadErrorsCounted", "ReadErrors"},

	// A gateway pair's (withOption).
	"espd_pair_role": {"gwpair/role.go Pair.Role (PAIR_ROLE), through pairsync.Node.SetRole",
		pairTestFile, "TestMetricsPair", "Role"},
	"espd_pair_peer_heard_seconds": {"pairsync/channel.go Node.receive, for every authentic message (Node.PeerHeard)",
		pairTestFile, "TestMetricsPair", "PeerHeard"},
	"espd_pair_messages_sent_total": {"pairsync/channel.go Node.encodeLocked, for every message it encodes",
		pairTestFile, "TestMetricsPair", "Sent"},
	"espd_pair_messages_received_total": {"pairsync/channel.go Node.receive, for every message it accepts",
		pairTestFile, "TestMetricsPair", "Received"},
	"espd_pair_sent_bytes_total": {"pairsync/channel.go Node.encodeLocked, for every message it encodes",
		pairTestFile, "TestMetricsPair", "SentBytes"},
	"espd_pair_received_bytes_total": {"pairsync/channel.go Node.receive, for every authentic message",
		pairTestFile, "TestMetricsPair", "RecvBytes"},
	"espd_pair_send_errors_total": {"pairsync/channel.go Node.send, when the pair link's WriteTo fails",
		pairTestFile, "TestMetricsPair", "SendErrors"},
	"espd_pair_rejected_total": {"pairsync/channel.go Node.receive, for a datagram Decode refuses",
		pairTestFile, "TestMetricsPair", "Rejected"},
	"espd_pair_reflected_total": {"pairsync/channel.go Node.refuse, for a datagram authentic under this node's own key and epoch",
		pairTestFile, "TestMetricsPair", "Reflected"},
	"espd_pair_replayed_total": {"pairsync/replay.go Node.acceptLocked, for an authentic message not newer than what was accepted",
		pairTestFile, "TestMetricsPair", "Replayed"},
	"espd_pair_misconfigured_total": {"pairsync/channel.go Node.receive and Node.refuse, for a message of a misconfigured node",
		pairTestFile, "TestMetricsPair", "Misconfigured"},
	"espd_pair_forgotten_total": {"pairsync/forget.go Node.forgetLocked, for each key absent from the other node's reports",
		pairTestFile, "TestMetricsPair", "Forgotten"},
	"espd_pair_split_brain_total": {"pairsync/channel.go Node.receive, for a reserve or windows message while active",
		pairTestFile, "TestMetricsPair", "SplitBrain"},
	"espd_pair_lease_waits_total": {"pairsync/nodestore.go Node.await, when the lease runs out before an ack",
		pairTestFile, "TestMetricsPair", "LeaseWaits"},
	"espd_pair_ack_waits_total": {"pairsync/nodestore.go Node.await, when a reservation it sent is acknowledged",
		pairTestFile, "TestMetricsPair", "AckWaits"},
	"espd_pair_record_errors_total": {"pairsync/channel.go Node.record, for each reservation the store refuses",
		pairTestFile, "TestMetricsPair", "RecordErrors"},
	"espd_pair_takeover_released": {"gwpair/role.go Pair.activate, for each state sa.DB.Activate released",
		pairTestFile, "TestMetricsPair", "released"},
	"espd_pair_takeover_stale_windows": {"gwpair/role.go Pair.activate, for each inbound state without a fresh window report",
		pairTestFile, "TestMetricsPair", "stale"},
	"espd_pair_takeover_silent": {"gwpair/role.go Pair.activate, for each state sa.DB.Activate left silent",
		pairTestFile, "TestMetricsPair", "silent"},
}

const pairTestFile = "gwpair/metrics_test.go"

// withOption maps the name prefix of the series a daemon exports only
// with an option TestMetricsSeries's daemon runs without to the test that
// moves them (TestMetricsPairListed holds them to movedElsewhere).
var withOption = map[string]string{"espd_pair_": "TestMetricsPair"}

// unproven lists the series that nothing in the tests moves yet, with why;
// TestMetricsSeries logs them. Keep it empty: a series belongs here only
// until a test causes what it counts.
var unproven = map[string]string{}

// TestMetricsSeries scrapes a running daemon, causes every event it counts
// (traffic through its TUN and sockets in its namespace, control calls,
// drops on its states), and scrapes again: every series must have moved,
// or be in movedElsewhere (or, logged, in unproven). A series added
// without anything that moves it fails here.
func TestMetricsSeries(t *testing.T) {
	d, client, ns := startMetricsDaemon(t, Options{
		// An outer MTU below the TUN's: a packet can be too big for a
		// state (stateDrops).
		Dataplane:    dataplane.Config{Keepalive: 100 * time.Millisecond, OuterMTU: stateDropsOuterMTU},
		MetricsPerSA: 1,
		IKEHandoff:   true,
	})
	scrapeHTTP := func(t *testing.T) string { return get(t, client) }
	before := scrapeBody(t, scrapeHTTP)

	// A peer daemon in its own namespace, across a veth pair; 198.18.5.0/24
	// stays unreachable.
	local, peer := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("198.18.0.2")
	peerNS := testbed.NewNodeT(t, "peer")
	testbed.VethT(t, ns, "va", peerNS, "vb")
	ns.MustIP(t, "addr", "add", "198.18.0.1/24", "dev", "va")
	peerNS.MustIP(t, "addr", "add", "198.18.0.2/24", "dev", "vb")
	pd := startPeer(t, peerNS)

	db := d.DB()
	sub := db.Subscribe(1) // never read: its second event is dropped
	t.Cleanup(sub.Close)

	policies := []sa.Policy{
		// UDP to 198.19.1.0/24 is protected (reqid 1), other protocols
		// reach the TUN (its route is per destination) without a policy.
		{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.1.0/24"), Proto: 17}, Dir: sa.DirOut, Action: sa.ActionProtect, ReqID: 1, Priority: 100},
		// UDP to port 7 bypasses, before the protect policy.
		{Selector: sa.Selector{Proto: 17, DstPorts: sa.PortRange{Lo: 7, Hi: 7}}, Dir: sa.DirOut, Action: sa.ActionBypass, Priority: 10},
		{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.2.0/24")}, Dir: sa.DirOut, Action: sa.ActionDrop, Priority: 100},
		// Protected by a state whose peer is unreachable.
		{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.4.0/24")}, Dir: sa.DirOut, Action: sa.ActionProtect, ReqID: 2, Priority: 100},
	}
	for _, p := range policies {
		if _, err := d.AddPolicy(p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := d.AllocSPI(0x7000, 0x7fff); err != nil {
		t.Fatal(err)
	}

	dp := func() dataplane.Stats { return d.dp.Stats() }
	wait := func(what string, ok func(dataplane.Stats) bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !ok(dp()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 5 s: %+v", what, dp())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	send := func(to string, payload []byte) {
		t.Helper()
		if _, err := ns.SendUDP(context.Background(), netip.MustParseAddrPort(to), testbed.UDPSendOptions{Payload: payload}); err != nil {
			t.Fatalf("send to %s: %v", to, err)
		}
	}
	payload := []byte("espd metrics series test")

	// No state yet: an acquire, then one the rate limit holds back, then
	// one for another destination, which the full subscriber loses.
	send("198.19.1.5:9", payload)
	wait("no SA", func(s dataplane.Stats) bool { return s.NoSA == 1 })
	send("198.19.1.5:9", payload)
	wait("no SA again", func(s dataplane.Stats) bool { return s.NoSA == 2 })
	send("198.19.1.6:9", payload)
	wait("no SA for another destination", func(s dataplane.Stats) bool { return s.NoSA == 3 })
	if g := db.Stats(); g.Acquires != 2 || g.AcquiresSuppressed != 1 || g.EventsDropped != 1 {
		t.Errorf("acquires %d, suppressed %d, events dropped %d; want 2, 1, 1", g.Acquires, g.AcquiresSuppressed, g.EventsDropped)
	}
	send("198.19.1.5:7", payload)
	wait("bypass in the TUN", func(s dataplane.Stats) bool { return s.BypassInTUN == 1 })
	send("198.19.2.5:9", payload)
	wait("drop policy", func(s dataplane.Stats) bool { return s.PolicyDrops == 1 })
	ns.Do(func() error { // a TCP SYN: no policy matches it
		c, err := net.DialTimeout("tcp", "198.19.1.5:80", 50*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return nil
	})
	wait("no policy", func(s dataplane.Stats) bool { return s.NoPolicy >= 1 })

	// States with the peer both ways (ESP-in-UDP), and one whose peer
	// has no route. The peer protects UDP to 198.19.10.0/24 towards us.
	suite, err := crypto.ParseSuite("aes128gcm16")
	if err != nil {
		t.Fatal(err)
	}
	state := func(spi uint32, dir sa.Direction, reqid uint32, src, dst netip.Addr, encap uint16) sa.Config {
		c := sa.Config{SPI: spi, Dir: dir, ReqID: reqid, Src: src, Dst: dst, Suite: suite,
			EncapSrcPort: encap, EncapDstPort: encap, EncKey: bytes.Repeat([]byte{0x5a}, suite.EncKeyLen())}
		for i := range c.EncKey {
			c.EncKey[i] = byte(i)
		}
		c.EncKey[0], c.EncKey[1] = byte(spi>>8), byte(spi)
		if dir == sa.DirIn {
			c.ReplayWindow = 64
		}
		return c
	}
	for _, c := range []sa.Config{
		state(0x300, sa.DirOut, 1, local, peer, 4500),
		state(0x400, sa.DirIn, 1, peer, local, 4500),
		state(0x301, sa.DirOut, 2, local, netip.MustParseAddr("198.18.5.1"), 0),
	} {
		if err := d.AddSA(c); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []sa.Config{
		state(0x300, sa.DirIn, 1, local, peer, 4500),
		state(0x400, sa.DirOut, 1, peer, local, 4500),
	} {
		if err := pd.AddSA(c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pd.AddPolicy(sa.Policy{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.10.0/24"), Proto: 17},
		Dir: sa.DirOut, Action: sa.ActionProtect, ReqID: 1}); err != nil {
		t.Fatal(err)
	}
	send("198.19.1.5:9", payload)
	wait("an outer packet sent", func(s dataplane.Stats) bool { return s.TxPackets >= 1 })
	sendFromPeer := func() {
		t.Helper()
		if _, err := peerNS.SendUDP(context.Background(), netip.MustParseAddrPort("198.19.10.5:9"), testbed.UDPSendOptions{Payload: payload}); err != nil {
			t.Fatal(err)
		}
	}
	sendFromPeer()
	wait("the peer's packet in the TUN", func(s dataplane.Stats) bool { return s.TUNTxPackets >= 1 })
	send("198.19.4.5:9", payload)
	wait("a send error", func(s dataplane.Stats) bool { return s.SendErrors >= 1 })
	wait("keepalives", func(s dataplane.Stats) bool { return s.KeepalivesTx >= 1 && s.KeepalivesRx >= 1 })

	// Straight to the encapsulation port: IKE (no IKE daemon is
	// registered for the hand-off yet: undelivered), an unknown SPI, and a
	// datagram too short for ESP.
	natt := netip.AddrPortFrom(local, 4500).String()
	send(natt, append(make([]byte, 4), make([]byte, 28)...))
	send(natt, append([]byte{0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 1}, payload...))
	send(natt, []byte{1, 2, 3})
	wait("IKE, invalid SPI, malformed", func(s dataplane.Stats) bool {
		return s.IKE == 1 && s.InvalidSPI == 1 && s.Malformed == 1
	})
	handOff(t, d, ns, local, peer)

	// Every reason a state drops for, each caused by what it counts.
	stateDrops(t, d, ns, peerNS, local, peer, suite)

	// The TUN down: the peer's next packet cannot be written to it.
	ns.MustIP(t, "link", "set", tun.DefaultName, "down")
	sendFromPeer()
	wait("a failed TUN write", func(s dataplane.Stats) bool { return s.TUNWriteErrors >= 1 })

	after := scrapeBody(t, scrapeHTTP)
	// What the acquire rate limit held back is not exported: it is the
	// difference of two series.
	if held, want := after["espd_dataplane_no_sa_total{}"]-after["espd_acquires_total{}"], db.Stats().AcquiresSuppressed; held != float64(want) {
		t.Errorf("espd_dataplane_no_sa_total - espd_acquires_total = %v, want the %d acquires the rate limit held back", held, want)
	}
	var still []string
	for key, v := range after {
		name, _, _ := strings.Cut(key, "{")
		if _, ok := movedElsewhere[name]; ok {
			continue
		}
		if why, ok := unproven[name]; ok {
			t.Logf("not proven to move: %s: %s", name, why)
			continue
		}
		if old, ok := before[key]; (ok && old == v) || (!ok && v == 0) {
			still = append(still, fmt.Sprintf("%s = %v", key, v))
		}
	}
	slices.Sort(still)
	for _, s := range still {
		t.Errorf("did not move: %s (cause it here, or list it in movedElsewhere)", s)
	}
	for key := range before {
		if _, ok := after[key]; !ok && !strings.HasPrefix(key, "espd_sa_") {
			t.Errorf("series %s went away", key)
		}
	}
	exported := map[string]bool{}
	for key := range after {
		name, _, _ := strings.Cut(key, "{")
		exported[name] = true
	}
	checkMovedElsewhere(t, exported)
	t.Logf("%d series; data path: %+v", len(after), dp())
}

// stateDropsOuterMTU is TestMetricsSeries's outer MTU: a state's inner MTU
// under it is below the TUN's MTU.
const stateDropsOuterMTU = 1280
