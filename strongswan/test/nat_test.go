package strongswantest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// TestNATTraversal puts gateway A behind a masquerading NAT: testbed's
// client namespace is gateway A (protecting its own address), gwA is the
// NAT router and gwB is gateway B in front of the server. charon detects
// the NAT, both espds carry ESP in UDP on port 4500 (espd owns it and hands
// IKE to charon), and A's espd sends NAT keepalives.
func TestNATTraversal(t *testing.T) {
	requireStrongSwan(t)
	topo := testbed.NewT(t, testbed.Options{Prefix: "sst"})
	ctx := context.Background()
	// gwA masquerades what leaves its transit link.
	for _, args := range [][]string{
		{"nft", "add", "table", "ip", "sstnat"},
		{"nft", "add", "chain", "ip", "sstnat", "post", "{ type nat hook postrouting priority 100 ; }"},
		{"nft", "add", "rule", "ip", "sstnat", "post", "oifname", testbed.IfTransit, "masquerade"},
	} {
		if _, err := topo.GwA.Run(ctx, args...); err != nil {
			t.Fatalf("setting up the NAT (nftables): %v", err)
		}
	}
	a := newGateway(t, topo.Client, "A")
	b := newGateway(t, topo.GwB, "B")
	a.startEspd("--keepalive", "1s")
	b.startEspd()
	a.startCharon(charonOptions{})
	b.startCharon(charonOptions{})

	client := testbed.ClientV4.Addr().String()
	a.load(connection{
		Local: client, Remote: testbed.GwBTransitV4.Addr().String(),
		LocalTS: client + "/32", RemoteTS: testbed.LANBV4.String(), ESP: "aes128gcm16",
	}.String())
	b.load(connection{
		Local: testbed.GwBTransitV4.Addr().String(), Remote: "%any", RemoteID: client,
		LocalTS: testbed.LANBV4.String(), RemoteTS: client + "/32", ESP: "aes128gcm16",
	}.String())
	a.mustSwanctl("--initiate", "--child", "net", "--timeout", "20")
	ca := a.waitChild("net", 10*time.Second)
	cb := b.waitChild("net", 10*time.Second)
	if !ca.Encap || !cb.Encap {
		t.Fatalf("NAT not detected: UDP encapsulation A %v, B %v", ca.Encap, cb.Encap)
	}
	if a.charonLogCount("local host is behind NAT") == 0 {
		t.Errorf("A: charon did not log that it is behind the NAT")
	}
	// espd got the encapsulation: B's states go to the NAT's mapped port.
	sa := b.mustEspctl("sa", "list")
	if !strings.Contains(sa, "udp") && !strings.Contains(sa, "encap") {
		t.Fatalf("B: espd's states carry no UDP encapsulation:\n%s", sa)
	}

	capB, err := topo.GwB.StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 128})
	if err != nil {
		t.Fatal(err)
	}
	transfer(t, topo.Client, topo.Server, testbed.IPv4, transferBytes, 0)
	transfer(t, topo.Server, topo.Client, testbed.IPv4, 4<<20, 0)
	time.Sleep(2500 * time.Millisecond) // keepalives, one per second
	res, err := capB.Stop()
	if err != nil {
		t.Fatal(err)
	}
	counts := res.Counts()
	t.Logf("B's transit link: %s", res.Summary())
	// Frames may be segmentation-offload super-packets: count bytes.
	var encapBytes int
	for _, f := range res.Frames {
		if f.Class == testbed.ClassESPInUDP {
			encapBytes += f.Len
		}
	}
	if encapBytes < transferBytes {
		t.Errorf("want the transfers as ESP-in-UDP on B's transit link, saw %d bytes of it", encapBytes)
	}
	if counts[testbed.ClassESP] != 0 {
		t.Errorf("raw ESP crossed the NAT: %d frames", counts[testbed.ClassESP])
	}
	if counts[testbed.ClassKeepalive] < 2 {
		t.Errorf("want NAT keepalives from A, saw %d", counts[testbed.ClassKeepalive])
	}
	// Everything from A arrives from the NAT's address.
	for _, f := range res.Frames {
		if f.Class == testbed.ClassESPInUDP || f.Class == testbed.ClassKeepalive {
			if f.Src.IsValid() && f.Src != testbed.GwATransitV4.Addr() && f.Src != testbed.GwBTransitV4.Addr() {
				t.Fatalf("frame from %v, not the NAT's address: %v", f.Src, f)
			}
		}
	}
	if c, _ := b.installedChild("net"); c.BytesIn < transferBytes {
		t.Errorf("B: swanctl shows %d bytes in, want at least %d", c.BytesIn, transferBytes)
	}
}
