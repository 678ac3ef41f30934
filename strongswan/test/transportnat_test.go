package strongswantest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// TestTransportNAT runs host-to-host transport mode through a NAT (RFC
// 3948's transport-mode case), in TestNATTraversal's topology: host A is
// testbed's client namespace, behind gwA, which masquerades it behind its
// transit address; host B is gwB. charon narrows A's private address in
// the traffic selectors to the NAT's address on B, so B's states and
// policies run between B and the NAT's address, A's between its private
// address and B. The inner TCP and UDP checksums, computed over the
// sender's view of the addresses, are fixed up by the receiving espd: TCP
// from A to B (and its acknowledgements back), TCP from B to the NAT's
// address (arriving at A's private one), pings and 9216-byte UDP datagrams
// each way must all arrive, and B's transit link must carry only
// ESP-in-UDP, IKE and keepalives.
func TestTransportNAT(t *testing.T) {
	requireStrongSwan(t)
	topo := testbed.NewT(t, testbed.Options{Prefix: "sst"})
	ctx := context.Background()
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

	private, public, hostB := testbed.ClientV4.Addr(), testbed.GwATransitV4.Addr(), testbed.GwBTransitV4.Addr()
	child := "        mode = transport"
	a.load(connection{Local: private.String(), Remote: hostB.String(),
		LocalTS: "dynamic", RemoteTS: "dynamic", ESP: "aes256gcm16", Child: child}.String())
	b.load(connection{Local: hostB.String(), Remote: "%any", RemoteID: private.String(),
		LocalTS: "dynamic", RemoteTS: "dynamic", ESP: "aes256gcm16", Child: child}.String())
	capB := startTransitCapture(t, topo.GwB)
	a.mustSwanctl("--initiate", "--child", "net", "--timeout", "20")
	ca := a.waitChild("net", 10*time.Second)
	cb := b.waitChild("net", 10*time.Second)
	if !ca.Encap || !cb.Encap || ca.Mode != "TRANSPORT" || cb.Mode != "TRANSPORT" {
		t.Fatalf("want UDP-encapsulated transport mode: A %+v, B %+v", ca, cb)
	}
	checkTransportSAs(t, a, "net", private, hostB)
	checkTransportSAs(t, b, "net", hostB, public)
	for _, g := range []struct {
		gw          *gateway
		want, wrong string
	}{{a, private.String() + "/32", public.String() + "/32"}, {b, public.String() + "/32", private.String() + "/32"}} {
		all := g.gw.mustEspctl("sa", "list") + g.gw.mustEspctl("policy", "list")
		if !strings.Contains(all, g.want) || strings.Contains(all, g.wrong) {
			t.Errorf("%s: espd's selectors should name %s for host A, never %s:\n%s", g.gw.name, g.want, g.wrong, all)
		}
	}

	r, err := topo.Client.Ping(ctx, hostB, testbed.PingOptions{Count: 5})
	if err != nil || !r.OK() {
		t.Fatalf("pings A -> B through the NAT in transport mode: %v\n%s", err, r.Output)
	}
	res, err := testbed.Transfer(ctx, testbed.TransferOptions{From: topo.Client, To: topo.GwB, Dst: hostB, Bytes: 8 << 20, Timeout: 60 * time.Second, Seed: 8})
	if err != nil {
		t.Fatalf("TCP A -> B: %v (%v)", err, res)
	}
	t.Logf("TCP A -> B: %v", res)
	reverseTransfer(t, topo.GwB, topo.Client, public, private, 4<<20)
	sendBigDatagram(t, topo.Client, topo.GwB, hostB, hostB)
	sendBigDatagram(t, topo.GwB, topo.Client, private, public)
	time.Sleep(1500 * time.Millisecond) // a keepalive or two
	checkTransportCapture(t, capB, true)
}

// reverseTransfer sends n random bytes over TCP from node from to dst (the
// NAT's address), to a receiver on node to listening on listen (the host's
// own address behind the NAT), and checks that the same bytes arrive:
// testbed.Transfer dials the receiver's own address, which a host outside
// the NAT cannot reach.
func reverseTransfer(t *testing.T, from, to *testbed.Node, dst, listen netip.Addr, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var ln net.Listener
	if err := to.Do(func() error {
		var err error
		ln, err = (&net.ListenConfig{}).Listen(ctx, "tcp", netip.AddrPortFrom(listen, 0).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	deadline, _ := ctx.Deadline()
	type result struct {
		sum [sha256.Size]byte
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		defer func() { done <- r }()
		_ = ln.(*net.TCPListener).SetDeadline(deadline)
		c, err := ln.Accept()
		if err != nil {
			r.err = err
			return
		}
		defer c.Close()
		_ = c.SetDeadline(deadline)
		h := sha256.New()
		r.n, r.err = io.Copy(h, c)
		h.Sum(r.sum[:0])
	}()
	data := make([]byte, n)
	rand.Read(data)
	sent := sha256.Sum256(data)
	err := from.Do(func() error {
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", netip.AddrPortFrom(dst, port).String())
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(deadline)
		if _, err := io.Copy(c, bytes.NewReader(data)); err != nil {
			return err
		}
		return c.(*net.TCPConn).CloseWrite()
	})
	if err != nil {
		ln.Close()
	}
	r := <-done
	if err != nil || r.err != nil || r.n != int64(n) || r.sum != sent {
		t.Fatalf("TCP %s -> %v (to %v): send %v, receive %v, %d of %d bytes, %s",
			from.Role, dst, listen, err, r.err, r.n, n, map[bool]string{true: "same data", false: "data differs"}[r.sum == sent])
	}
	t.Logf("TCP %s -> %v (to %v on %s): %s", from.Role, dst, listen, to.Role, fmt.Sprintf("%d bytes", n))
}
