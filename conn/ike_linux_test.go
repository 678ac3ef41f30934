package conn

import (
	"bytes"
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// TestIKEReadErrorsCounted: a failed read of an IKE-port socket counts in
// IKEStats.ReadErrors (espd_ike_read_errors_total), and the relay reads on
// after it. The failure is a read deadline in the past: without
// IP_RECVERR, which the IKE sockets leave off, the kernel reports no
// error on an unconnected UDP socket's reads that a test could provoke
// from the network.
func TestIKEReadErrorsCounted(t *testing.T) {
	a, b := twoNS(t)
	s := openIn(t, a, SocketConfig{Mark: testMark, EncapPort: 4501, NoIPv6: true})
	got := make(chan IKEPacket, 1)
	if err := a.Do(func() error { // the IKE port's sockets open in a
		return s.StartIKE(501, func(p IKEPacket) {
			select {
			case got <- IKEPacket{Src: p.Src, Dst: p.Dst, Data: bytes.Clone(p.Data)}:
			default:
			}
		})
	}); err != nil {
		t.Fatal(err)
	}
	sk := s.ike.running.Load().socks[0].conn
	if err := sk.SetReadDeadline(time.Unix(1, 0)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.IKEStats().ReadErrors == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no read error counted within 10 s")
		}
		time.Sleep(time.Millisecond)
	}
	// A persistent error does not spin: the reader backs off (1, 2, 4 ...
	// up to 100 ms), so 300 ms of errors count a handful, not the
	// hundreds of thousands of a loop that retries at once.
	before := s.IKEStats().ReadErrors
	time.Sleep(300 * time.Millisecond)
	if n := s.IKEStats().ReadErrors - before; n > 50 {
		t.Errorf("%d read errors in 300 ms of a persistent error: the reader does not back off", n)
	}
	if err := sk.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	if st := s.IKEStats(); st.Received != 0 || st.Sent != 0 || st.SendErrors != 0 || st.Refused != 0 {
		t.Errorf("a read error moved other counters: %+v", st)
	}

	ike := []byte("an IKE datagram after the read errors")
	if _, err := b.SendUDP(context.Background(), netip.MustParseAddrPort("198.18.1.1:501"), testbed.UDPSendOptions{Payload: ike}); err != nil {
		t.Fatal(err)
	}
	select {
	case p := <-got:
		if !bytes.Equal(p.Data, ike) || p.Dst.Port() != 501 {
			t.Errorf("handed over %q to %v", p.Data, p.Dst)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the relay read nothing after the read errors: %+v", s.IKEStats())
	}
	if st := s.IKEStats(); st.Received != 1 {
		t.Errorf("Received %d after one datagram, want 1", st.Received)
	}
}
