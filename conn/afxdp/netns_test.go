package afxdp

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/packet"
	"github.com/espd/espd/testbed"
)

// vethPair builds two namespaces joined by a veth pair, peer (a0) and self
// (b0), with IPv4 and IPv6 addresses.
func vethPair(t *testing.T) (peer, self *testbed.Node) { return vethQueues(t, 0) }

// vethQueues is vethPair with queues receive and transmit queues on each
// end (0: the veth's default).
func vethQueues(t *testing.T, queues int) (peer, self *testbed.Node) {
	t.Helper()
	needRoot(t)
	peer, self = testbed.NewNodeT(t, "xdppeer"), testbed.NewNodeT(t, "xdpself")
	for _, n := range []*testbed.Node{peer, self} {
		for _, k := range []string{"net/ipv6/conf/all/disable_ipv6", "net/ipv6/conf/default/disable_ipv6"} {
			if err := n.Sysctl(k, "0"); err != nil {
				t.Fatal(err)
			}
		}
	}
	if queues == 0 {
		testbed.VethT(t, peer, "a0", self, "b0")
	} else {
		q := strconv.Itoa(queues)
		peer.MustIP(t, "link", "add", "name", "a0", "numtxqueues", q, "numrxqueues", q, "type", "veth",
			"peer", "name", "b0", "numtxqueues", q, "numrxqueues", q, "netns", self.Name)
		peer.MustIP(t, "link", "set", "a0", "up")
		self.MustIP(t, "link", "set", "b0", "up")
	}
	for _, c := range []struct {
		n         *testbed.Node
		dev, a, b string
	}{{peer, "a0", "198.18.0.1/24", "2001:db8::1/64"}, {self, "b0", "198.18.0.2/24", "2001:db8::2/64"}} {
		c.n.MustIP(t, "addr", "add", c.a, "dev", c.dev)
		c.n.MustIP(t, "addr", "add", c.b, "dev", c.dev, "nodad")
	}
	return peer, self
}

// openIn opens a Path in n.
func openIn(t *testing.T, n *testbed.Node, cfg Config) *Path {
	t.Helper()
	var p *Path
	if err := n.Do(func() (err error) { p, err = Open(cfg); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// collect reads every receiver of p into a channel until p closes.
func collect(p *Path) (<-chan conn.Message, *sync.WaitGroup) {
	ch := make(chan conn.Message, 4096)
	var wg sync.WaitGroup
	for _, r := range p.Receivers() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msgs := make([]conn.Message, 32)
			for i := range msgs {
				msgs[i].Buf = make([]byte, 2048)
			}
			for {
				n, err := r.Receive(msgs)
				if err != nil {
					return
				}
				for _, m := range msgs[:n] {
					c := m
					c.Buf = append([]byte(nil), m.Buf...)
					ch <- c
				}
			}
		}()
	}
	return ch, &wg
}

// kernelESP opens a raw ESP socket of family fam in n: what the program
// passes on reaches it.
func kernelESP(t *testing.T, n *testbed.Node, fam int) int {
	t.Helper()
	var fd int
	err := n.Do(func() (err error) {
		fd, err = unix.Socket(fam, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.IPPROTO_ESP)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// kernelSPIs returns the SPIs read from the raw ESP socket fd so far.
func kernelSPIs(fd int, v4 bool) []uint32 {
	var spis []uint32
	b := make([]byte, 4096)
	for range 10000 {
		n, _, err := unix.Recvfrom(fd, b, 0)
		if err != nil {
			return spis
		}
		p := b[:n]
		if v4 {
			p = p[int(p[0]&0xf)*4:]
		}
		if len(p) >= 4 {
			spis = append(spis, uint32(p[0])<<24|uint32(p[1])<<16|uint32(p[2])<<8|uint32(p[3]))
		}
	}
	return spis
}

// TestReceive sends raw ESP and ESP-in-UDP from a peer namespace through
// a veth to a Path: the frames of its states arrive on its receivers
// whole, with their outer addresses, ports and TOS; others (another SPI,
// IKE, a keepalive) reach the kernel's sockets; after Close everything
// does. In both attach modes, and auto, which is generic on a veth.
func TestReceive(t *testing.T) {
	for _, mode := range []string{ModeNative, ModeGeneric, ModeAuto} {
		t.Run("mode-"+cmp.Or(mode, "auto"), func(t *testing.T) { testReceive(t, mode) })
	}
}

func testReceive(t *testing.T, mode string) {
	peer, self := vethPair(t)
	p := openIn(t, self, Config{Devices: []string{"b0"}, EncapPort: 4500, Mode: mode})
	a := p.Attached()
	wantMode := mode
	if mode == ModeAuto {
		wantMode = ModeGeneric
	}
	if len(a) != 1 || a[0].Queues < 1 || a[0].Mode != wantMode {
		t.Fatalf("attached %+v, want mode %s", a, wantMode)
	}
	t.Logf("attached %+v", a[0])
	if err := p.SetStates([]State{{SPI: 0x1001, Dst: self4, Src: peer4}, {SPI: 0x1002, Dst: self6, Src: peer6}}); err != nil {
		t.Fatal(err)
	}
	k4, k6 := kernelESP(t, self, unix.AF_INET), kernelESP(t, self, unix.AF_INET6)
	ch, wg := collect(p)

	type sent struct {
		src, dst netip.AddrPort
		udp      bool
		payload  []byte
	}
	var want []sent
	const count = 200
	for i := range count {
		body := bytes.Repeat([]byte{byte(i)}, 64+i*7%1300)
		spi, src, dst := uint32(0x1001), peer4, self4
		if i%2 == 1 {
			spi, src, dst = 0x1002, peer6, self6
		}
		esp := testbed.BuildESP(spi, uint32(i+1), body)
		var pkt []byte
		var err error
		s := sent{src: netip.AddrPortFrom(src, 0), dst: netip.AddrPortFrom(dst, 0), payload: esp}
		if i%4 >= 2 {
			pkt, err = udpIP(src, dst, esp)
			s.src, s.dst, s.udp = netip.AddrPortFrom(src, 4500), netip.AddrPortFrom(dst, 4500), true
		} else {
			pkt, err = testbed.BuildIP(src, dst, packet.ProtoESP, esp)
		}
		if err != nil {
			t.Fatal(err)
		}
		setTOS(pkt, 0xb8)
		if err := peer.InjectIP(pkt); err != nil {
			t.Fatalf("packet %d: %v", i, err)
		}
		want = append(want, s)
	}
	// The kernel's: another SPI, an IKE message and a keepalive on 4500.
	other, _ := testbed.BuildIP(peer4, self4, packet.ProtoESP, testbed.BuildESP(0x1003, 1, make([]byte, 32)))
	ike, _ := udpIP(peer4, self4, make([]byte, 64))
	ka, _ := udpIP(peer4, self4, []byte{0xff})
	for _, pkt := range [][]byte{other, ike, ka} {
		if err := peer.InjectIP(pkt); err != nil {
			t.Fatal(err)
		}
	}

	got := map[string]conn.Message{}
	deadline := time.After(30 * time.Second)
	for len(got) < count {
		select {
		case m := <-ch:
			if m.Err != nil {
				t.Fatalf("message error: %v", m.Err)
			}
			got[string(m.Buf[m.Start:m.End])] = m
		case <-deadline:
			t.Fatalf("%d of %d packets arrived", len(got), count)
		}
	}
	for i, s := range want {
		m, ok := got[string(s.payload)]
		if !ok {
			t.Fatalf("packet %d missing or changed", i)
		}
		if m.Src != s.src || m.Dst != s.dst || m.UDP != s.udp || m.TOS != 0xb8 {
			t.Errorf("packet %d: src %v dst %v udp %v tos %#x, want %v %v %v 0xb8", i, m.Src, m.Dst, m.UDP, m.TOS, s.src, s.dst, s.udp)
		}
	}
	if !testbed.Poll(10*time.Second, 20*time.Millisecond, func() bool { return len(kernelSPIs(k4, true)) > 0 }) {
		t.Fatal("the other SPI did not reach the kernel's raw socket")
	}
	if st := p.Stats(); st.Frames != count || st.Dropped != 0 {
		t.Errorf("stats %+v, want %d frames, none dropped", st, count)
	}
	select {
	case m := <-ch:
		t.Fatalf("unexpected packet on the AF_XDP path: %x", m.Buf[m.Start:m.End])
	default:
	}

	// Closed, the program is gone: the states' frames are the kernel's.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	pkt, _ := testbed.BuildIP(peer6, self6, packet.ProtoESP, testbed.BuildESP(0x1002, 999, make([]byte, 32)))
	if err := peer.InjectIP(pkt); err != nil {
		t.Fatal(err)
	}
	if !testbed.Poll(10*time.Second, 20*time.Millisecond, func() bool {
		for _, spi := range kernelSPIs(k6, false) {
			if spi == 0x1002 {
				return true
			}
		}
		return false
	}) {
		t.Fatal("after Close, the state's frame did not reach the kernel")
	}
}

// udpIP returns an IP packet with payload on UDP port 4500 both ways.
func udpIP(src, dst netip.Addr, payload []byte) ([]byte, error) {
	u, err := testbed.BuildUDP(src, dst, 4500, 4500, payload)
	if err != nil {
		return nil, err
	}
	return testbed.BuildIP(src, dst, packet.ProtoUDP, u)
}

// TestQueues: on a device with four receive queues, Open binds a socket
// to each and every frame arrives, whichever queue it came in on.
func TestQueues(t *testing.T) {
	peer, self := vethQueues(t, 4)
	p := openIn(t, self, Config{Devices: []string{"b0"}})
	if a := p.Attached(); len(a) != 1 || a[0].Queues != 4 || len(p.Receivers()) != 4 {
		t.Fatalf("attached %+v with %d receivers, want 4 queues", a, len(p.Receivers()))
	}
	if err := p.SetStates([]State{{SPI: 0x1001, Dst: self4, Src: peer4}}); err != nil {
		t.Fatal(err)
	}
	ch, _ := collect(p)
	const count = 64
	for i := range count {
		pkt, err := testbed.BuildIP(peer4, self4, packet.ProtoESP, testbed.BuildESP(0x1001, uint32(i+1), make([]byte, 48)))
		if err != nil {
			t.Fatal(err)
		}
		if err := peer.InjectIP(pkt); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[uint32]bool{}
	deadline := time.After(30 * time.Second)
	for len(seen) < count {
		select {
		case m := <-ch:
			if m.Err != nil {
				t.Fatal(m.Err)
			}
			seen[binary.BigEndian.Uint32(m.Buf[m.Start+4:])] = true
		case <-deadline:
			t.Fatalf("%d of %d packets arrived", len(seen), count)
		}
	}
}

// TestFirewallSeesTheRest: netfilter's input chain does not see the
// frames the program takes (the state's, from its peer), and sees every
// other frame: the same SPI from another source, to the kernel as before.
func TestFirewallSeesTheRest(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("nft is required in CI")
		}
		t.Skip("no nft")
	}
	peer, self := vethPair(t)
	other4 := netip.MustParseAddr("198.18.0.3")
	for _, cmd := range [][]string{
		{"nft", "add", "table", "inet", "t"},
		{"nft", "add", "chain", "inet", "t", "in", "{ type filter hook input priority 0; }"},
		{"nft", "add", "rule", "inet", "t", "in", "meta", "l4proto", "esp", "counter"},
	} {
		if out, err := self.Run(context.Background(), cmd...); err != nil {
			t.Fatalf("%v: %v\n%s", cmd, err, out)
		}
	}
	p := openIn(t, self, Config{Devices: []string{"b0"}})
	if err := p.SetStates([]State{{SPI: 0x1001, Dst: self4, Src: peer4}}); err != nil {
		t.Fatal(err)
	}
	ch, _ := collect(p)
	const each = 10
	for i := range 2 * each {
		src := peer4
		if i >= each {
			src = other4
		}
		pkt, err := testbed.BuildIP(src, self4, packet.ProtoESP, testbed.BuildESP(0x1001, uint32(i+1), make([]byte, 48)))
		if err != nil {
			t.Fatal(err)
		}
		if err := peer.InjectIP(pkt); err != nil {
			t.Fatal(err)
		}
	}
	counted := func() int {
		out, err := self.Run(context.Background(), "nft", "list", "chain", "inet", "t", "in")
		if err != nil {
			return -1
		}
		f := strings.Fields(out[strings.Index(out, "packets")+len("packets"):])
		if len(f) == 0 {
			return -1
		}
		n, _ := strconv.Atoi(f[0])
		return n
	}
	if !testbed.Poll(10*time.Second, 20*time.Millisecond, func() bool { return counted() >= each }) {
		t.Fatalf("the input chain counted %d ESP packets, want the %d from another source", counted(), each)
	}
	for range each {
		select {
		case m := <-ch:
			if m.Src.Addr() != peer4 {
				t.Errorf("AF_XDP took a frame from %v", m.Src)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the peer's frames did not arrive on AF_XDP")
		}
	}
	if n := counted(); n != each {
		t.Errorf("the input chain counted %d ESP packets, want %d: only those from another source", n, each)
	}
	select {
	case m := <-ch:
		t.Errorf("AF_XDP took an extra frame from %v", m.Src)
	default:
	}
}

func setTOS(pkt []byte, tos uint8) {
	if pkt[0]>>4 == 4 {
		pkt[1] = tos
		pkt[10], pkt[11] = 0, 0 // the kernel fills it in
		return
	}
	pkt[0] = 0x60 | tos>>4
	pkt[1] = tos<<4 | pkt[1]&0x0f
}

// TestOpenFails: a device that does not exist makes Open fail with
// ErrUnavailable, closing what it opened.
func TestOpenFails(t *testing.T) {
	_, self := vethPair(t)
	err := self.Do(func() error {
		p, err := Open(Config{Devices: []string{"b0", "nosuchdev"}})
		if err == nil {
			p.Close()
			return fmt.Errorf("opened")
		}
		if !errors.Is(err, ErrUnavailable) {
			return fmt.Errorf("error %v is not ErrUnavailable", err)
		}
		t.Log(err)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// b0 was released: a new Path attaches to it.
	p := openIn(t, self, Config{Devices: []string{"b0"}})
	p.Close()
}
