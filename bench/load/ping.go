package load

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/espd/espd/testbed"
)

// RTT is what Ping measured: the round-trip times and the counts.
type RTT struct {
	Min, Avg, Max, Mdev   time.Duration
	Transmitted, Received int
	// ID is the requests' ICMP identifier; Each the round trip of each
	// request by sequence number (0: not answered).
	ID   uint16
	Each []time.Duration
}

// Ping timing: requests go PingInterval apart, and the last one's reply is
// awaited for PingWait.
const (
	PingInterval = 20 * time.Millisecond
	PingWait     = time.Second
)

// pingPayload is the size of an echo request's data: a 16-byte tag that
// tells the harness's requests from any other, then padding up to the
// 56 bytes iputils ping sends by default.
const pingPayload = 56

// Ping sends count ICMP echo requests PingInterval apart from node to dst
// over an idle path and returns the round-trip times; every request must
// be answered within PingWait of the last one. It is written in Go on a
// raw ICMP socket made in node's namespace (root, as the harness runs), so
// the harness needs no ping program. The requests carry a random tag, and
// only replies from dst with that tag count.
func Ping(ctx context.Context, node *testbed.Node, dst netip.Addr, count int) (RTT, error) {
	if count <= 0 {
		return RTT{}, errors.New("load: ping needs a count above 0")
	}
	network, listen, proto := "ip4:icmp", "0.0.0.0", 1
	var reqType, replyType icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	if dst.Is6() {
		network, listen, proto = "ip6:ipv6-icmp", "::", 58
		reqType, replyType = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
	}
	var c *icmp.PacketConn
	if err := node.Do(func() (err error) {
		c, err = icmp.ListenPacket(network, listen)
		return err
	}); err != nil {
		return RTT{}, fmt.Errorf("load: ping from %s: %w", node.Role, err)
	}
	defer c.Close()

	var tag [16]byte
	if _, err := rand.Read(tag[:]); err != nil {
		return RTT{}, err
	}
	id := int(binary.BigEndian.Uint16(tag[:2]))
	data := make([]byte, pingPayload)
	copy(data, tag[:])

	var mu sync.Mutex // guards sent
	sent := make([]time.Time, count)
	rtts := make([]time.Duration, count)
	got := make([]bool, count)
	received := 0
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 1500)
		for received < count {
			n, peer, err := c.ReadFrom(buf)
			if err != nil {
				done <- err
				return
			}
			now := time.Now()
			m, err := icmp.ParseMessage(proto, buf[:n])
			if err != nil || m.Type != replyType {
				continue
			}
			echo, ok := m.Body.(*icmp.Echo)
			if !ok || echo.ID != id || echo.Seq < 0 || echo.Seq >= count || len(echo.Data) < len(tag) || string(echo.Data[:len(tag)]) != string(tag[:]) {
				continue
			}
			mu.Lock()
			at := sent[echo.Seq]
			mu.Unlock()
			if ip, ok := peer.(*net.IPAddr); !ok || !sameAddr(ip.IP, dst) || got[echo.Seq] || at.IsZero() {
				continue
			}
			got[echo.Seq] = true
			rtts[echo.Seq] = now.Sub(at)
			received++
		}
		done <- nil
	}()

	to := &net.IPAddr{IP: net.IP(dst.AsSlice()), Zone: dst.Zone()}
	transmitted := 0
	for seq := 0; seq < count; seq++ {
		if seq > 0 {
			select {
			case <-ctx.Done():
				return RTT{}, ctx.Err()
			case <-time.After(PingInterval):
			}
		}
		b, err := (&icmp.Message{Type: reqType, Body: &icmp.Echo{ID: id, Seq: seq, Data: data}}).Marshal(nil)
		if err != nil {
			return RTT{}, err
		}
		mu.Lock()
		sent[seq] = time.Now()
		mu.Unlock()
		if _, err := c.WriteTo(b, to); err != nil {
			return RTT{}, fmt.Errorf("load: ping %v from %s: %w", dst, node.Role, err)
		}
		transmitted++
	}
	_ = c.SetReadDeadline(time.Now().Add(PingWait))
	var readErr error
	select {
	case readErr = <-done:
	case <-ctx.Done():
		_ = c.SetReadDeadline(time.Now())
		<-done
		return RTT{}, ctx.Err()
	}
	if readErr != nil && !errors.Is(readErr, context.DeadlineExceeded) && !isTimeout(readErr) {
		return RTT{}, fmt.Errorf("load: ping %v from %s: %w", dst, node.Role, readErr)
	}
	var answered []time.Duration
	for i, ok := range got {
		if ok {
			answered = append(answered, rtts[i])
		}
	}
	r := summarize(answered)
	r.Transmitted = transmitted
	r.ID, r.Each = uint16(id), rtts
	if r.Received != transmitted {
		return r, fmt.Errorf("load: ping %v from %s: %d of %d answered", dst, node.Role, r.Received, r.Transmitted)
	}
	return r, nil
}

// summarize returns the minimum, average, maximum and mean deviation of
// rtts as iputils ping reports them (mdev is the standard deviation), and
// their number as Received.
func summarize(rtts []time.Duration) RTT {
	r := RTT{Received: len(rtts)}
	if len(rtts) == 0 {
		return r
	}
	var sum, sum2 float64
	r.Min = rtts[0]
	for _, d := range rtts {
		r.Min, r.Max = min(r.Min, d), max(r.Max, d)
		f := float64(d)
		sum += f
		sum2 += f * f
	}
	n := float64(len(rtts))
	avg := sum / n
	r.Avg = time.Duration(avg)
	r.Mdev = time.Duration(math.Sqrt(max(0, sum2/n-avg*avg)))
	return r
}

func sameAddr(ip net.IP, a netip.Addr) bool {
	b, ok := netip.AddrFromSlice(ip)
	return ok && b.Unmap() == a.Unmap()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
