package conn

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/espd/espd/packet"
	"github.com/espd/espd/testbed"
)

const testMark = 0xe5d7

// outPkt returns a Packet of payload from src to dst (ESP-in-UDP when
// dport != 0) with TOS tos, DF set and TTL 64, with HeaderRoom in front.
func outPkt(src, dst netip.Addr, sport, dport uint16, tos uint8, payload []byte) Packet {
	buf := make([]byte, HeaderRoom+len(payload))
	copy(buf[HeaderRoom:], payload)
	return Packet{
		Buf: buf, Start: HeaderRoom, End: len(buf),
		Endpoint: Endpoint{Src: src, Dst: dst, SrcPort: sport, DstPort: dport, TTL: 64},
		TOS:      tos, DF: true, ID: 1,
	}
}

// twoNS connects namespaces a (198.18.1.1, 2001:db8:1::1) and b
// (198.18.1.2, 2001:db8:1::2) with a veth pair.
func twoNS(t *testing.T) (a, b *testbed.Node) {
	t.Helper()
	a, b = testbed.NewNodeT(t, "dpa"), testbed.NewNodeT(t, "dpb")
	testbed.VethT(t, a, "va", b, "vb")
	a.MustIP(t, "addr", "add", "198.18.1.1/24", "dev", "va")
	b.MustIP(t, "addr", "add", "198.18.1.2/24", "dev", "vb")
	a.MustIP(t, "-6", "addr", "add", "2001:db8:1::1/64", "dev", "va", "nodad")
	b.MustIP(t, "-6", "addr", "add", "2001:db8:1::2/64", "dev", "vb", "nodad")
	return a, b
}

func openIn(t *testing.T, ns *testbed.Node, cfg SocketConfig) *Sockets {
	t.Helper()
	var s *Sockets
	if err := ns.Do(func() (err error) { s, err = OpenSockets(cfg); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// receiveOne reads one message from r within 5 s.
func receiveOne(t *testing.T, r Receiver, bufSize int) Message {
	t.Helper()
	msgs := []Message{{Buf: make([]byte, bufSize)}}
	type res struct {
		n   int
		err error
	}
	c := make(chan res, 1)
	go func() {
		n, err := r.Receive(msgs)
		c <- res{n, err}
	}()
	select {
	case x := <-c:
		if x.err != nil || x.n != 1 {
			t.Fatalf("Receive: %d, %v", x.n, x.err)
		}
		return msgs[0]
	case <-time.After(5 * time.Second):
		r.Close()
		<-c
		t.Fatal("nothing received within 5 s")
		return Message{}
	}
}

func TestSocketsRoundTrip(t *testing.T) {
	a, b := twoNS(t)
	// In a, only marked packets may leave: everything else is routed to
	// an unreachable route, so a send succeeds only if SO_MARK is set.
	for _, fam := range []string{"-4", "-6"} {
		a.MustIP(t, fam, "rule", "add", "pref", "100", "not", "fwmark", strconv.Itoa(testMark), "lookup", "100")
		a.MustIP(t, fam, "route", "add", "unreachable", "default", "table", "100")
	}
	sa := openIn(t, a, SocketConfig{Mark: testMark, EncapPort: 4501})
	sb := openIn(t, b, SocketConfig{Mark: testMark, EncapPort: 4501})
	rb := sb.Receivers() // raw4, udp4, raw6, udp6
	if len(rb) != 4 {
		t.Fatalf("%d receivers", len(rb))
	}
	esp := []byte{0, 0, 0x12, 0x34, 0, 0, 0, 1, 'e', 's', 'p', 'd', 1, 2, 3, 4}
	a4, b4 := netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("198.18.1.2")
	a6, b6 := netip.MustParseAddr("2001:db8:1::1"), netip.MustParseAddr("2001:db8:1::2")
	// The four paths: raw ESP and ESP-in-UDP, IPv4 and IPv6.
	paths := []struct {
		name     string
		src, dst netip.Addr
		dport    uint16
		r        Receiver
	}{
		{"raw4", a4, b4, 0, rb[0]},
		{"udp4", a4, b4, 4501, rb[1]},
		{"raw6", a6, b6, 0, rb[2]},
		{"udp6", a6, b6, 4501, rb[3]},
	}
	for _, tc := range paths {
		t.Run(tc.name, func(t *testing.T) {
			const tos = 46<<2 | packet.ECNECT0
			if n, err := sa.Send([]Packet{outPkt(tc.src, tc.dst, 4501, tc.dport, tos, esp)}); n != 1 || err != nil {
				t.Fatalf("Send: %d, %v", n, err)
			}
			m := receiveOne(t, tc.r, 2048)
			if m.Err != nil {
				t.Fatal(m.Err)
			}
			if !bytes.Equal(m.Buf[m.Start:m.End], esp) {
				t.Errorf("payload % x, want % x", m.Buf[m.Start:m.End], esp)
			}
			if m.Start < RecvOffset {
				t.Errorf("Start %d below RecvOffset", m.Start)
			}
			wantPort := uint16(0)
			if tc.dport != 0 {
				wantPort = 4501
			}
			if m.Src != netip.AddrPortFrom(tc.src, wantPort) || m.Dst != netip.AddrPortFrom(tc.dst, wantPort) {
				t.Errorf("src %v dst %v", m.Src, m.Dst)
			}
			if m.TOS != tos {
				t.Errorf("TOS %#x, want %#x", m.TOS, tos)
			}
			if m.UDP != (tc.dport != 0) {
				t.Errorf("UDP = %v", m.UDP)
			}
		})
	}

	// Larger than the path takes: the raw path sends fragments, which the
	// peer's kernel reassembles before its socket sees the packet.
	for _, tc := range paths {
		t.Run("fragmented "+tc.name, func(t *testing.T) {
			big := make([]byte, 3000)
			for i := range big {
				big[i] = byte(i * 13)
			}
			copy(big, esp)
			p := outPkt(tc.src, tc.dst, 4501, tc.dport, 0, big)
			p.DF, p.FragmentAbove = false, 1280
			if n, err := sa.Send([]Packet{p}); n != 3 || err != nil {
				t.Fatalf("Send: %d, %v; want 3 fragments", n, err)
			}
			m := receiveOne(t, tc.r, 4096)
			if m.Err != nil || !bytes.Equal(m.Buf[m.Start:m.End], big) {
				t.Fatalf("reassembled: %d bytes, %v", m.End-m.Start, m.Err)
			}
		})
	}

	t.Run("truncated", func(t *testing.T) {
		big := make([]byte, 600)
		copy(big, esp)
		if _, err := sa.Send([]Packet{outPkt(a4, b4, 4501, 4501, 0, big)}); err != nil {
			t.Fatal(err)
		}
		if m := receiveOne(t, rb[1], RecvOffset+200); !errors.Is(m.Err, ErrTruncated) {
			t.Errorf("Err = %v, want ErrTruncated", m.Err)
		}
	})

	t.Run("batch", func(t *testing.T) {
		var pkts []Packet
		for i := range 40 {
			pl := append([]byte(nil), esp...)
			pl[7] = byte(i)
			pkts = append(pkts, outPkt(a4, b4, 4501, 4501, 0, pl))
		}
		if n, err := sa.Send(pkts); n != 40 || err != nil {
			t.Fatalf("Send: %d, %v", n, err)
		}
		msgs := make([]Message, 64)
		for i := range msgs {
			msgs[i].Buf = make([]byte, 2048)
		}
		got := 0
		deadline := time.AfterFunc(5*time.Second, func() { rb[1].Close() })
		defer deadline.Stop()
		for got < 40 {
			n, err := rb[1].Receive(msgs)
			if err != nil {
				t.Fatalf("after %d: %v", got, err)
			}
			for i := range n {
				if m := msgs[i]; m.Err != nil || m.Buf[m.Start+7] != byte(got) {
					t.Fatalf("message %d out of order or bad: %v", got, m.Err)
				}
				got++
			}
		}
	})

	t.Run("unmarked is blocked", func(t *testing.T) {
		// The same kind of socket without the mark cannot send: proves the
		// mark above was what let the packets out.
		var s *Sockets
		err := a.Do(func() (err error) { s, err = OpenSockets(SocketConfig{EncapPort: 4502}); return err })
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		n, err := s.Send([]Packet{outPkt(a4, b4, 0, 0, 0, esp), outPkt(a6, b6, 0, 0, 0, esp)})
		if n != 0 || err == nil {
			t.Errorf("unmarked Send: %d, %v; want 0 and an error", n, err)
		}
	})
}

// TestSocketsGSO sends runs of ESP-in-UDP that the sender groups into
// UDP_SEGMENT messages (same size, TOS and peer; a shorter packet ends a
// run) mixed with packets it must send raw (DF clear), and checks that the
// receiver splits what UDP_GRO delivers back into the same packets, in
// order, each with its own TOS, and that with GSO on the runs did travel
// as fewer datagrams.
func TestSocketsGSO(t *testing.T) {
	for _, noGSO := range []bool{false, true} {
		t.Run(fmt.Sprintf("NoGSO=%v", noGSO), func(t *testing.T) {
			a, b := twoNS(t)
			sa := openIn(t, a, SocketConfig{Mark: testMark, EncapPort: 4503, NoGSO: noGSO, RecvBuffer: 4 << 20})
			sb := openIn(t, b, SocketConfig{Mark: testMark, EncapPort: 4503, NoGSO: noGSO, RecvBuffer: 4 << 20})
			for _, fam := range []struct {
				name     string
				src, dst netip.Addr
				r        Receiver
			}{
				{"IPv4", netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("198.18.1.2"), sb.Receivers()[1]},
				{"IPv6", netip.MustParseAddr("2001:db8:1::1"), netip.MustParseAddr("2001:db8:1::2"), sb.Receivers()[3]},
			} {
				t.Run(fam.name, func(t *testing.T) {
					const total = 300
					var pkts []Packet
					tosOf := func(i int) uint8 { return uint8(i/25) << 2 }
					for i := range total {
						size := 1000
						switch {
						case i%50 == 49:
							size = 300 // ends a run
						case i%70 == 69:
							size = 1200 // larger: starts a new run
						}
						pl := make([]byte, size)
						binary.BigEndian.PutUint32(pl, 0x1234)
						binary.BigEndian.PutUint32(pl[4:], uint32(i))
						p := outPkt(fam.src, fam.dst, 4503, 4503, tosOf(i), pl)
						if fam.src.Is4() && i%90 == 89 {
							p.DF = false // not for the UDP socket
						}
						pkts = append(pkts, p)
					}
					if n, err := sa.Send(pkts); n != total || err != nil {
						t.Fatalf("Send: %d, %v", n, err)
					}
					msgs := make([]Message, 64)
					for i := range msgs {
						msgs[i].Buf = make([]byte, 2048)
					}
					deadline := time.AfterFunc(5*time.Second, func() { fam.r.Close() })
					defer deadline.Stop()
					got := 0
					for got < total {
						n, err := fam.r.Receive(msgs)
						if err != nil {
							t.Fatalf("after %d: %v", got, err)
						}
						for _, m := range msgs[:n] {
							if m.Err != nil {
								t.Fatalf("packet %d: %v", got, m.Err)
							}
							p := m.Buf[m.Start:m.End]
							if len(p) < 8 || binary.BigEndian.Uint32(p[4:]) != uint32(got) {
								t.Fatalf("packet %d: got number %d (%d bytes)", got, binary.BigEndian.Uint32(p[4:]), len(p))
							}
							if want := pkts[got].End - pkts[got].Start; len(p) != want {
								t.Fatalf("packet %d: %d bytes, want %d", got, len(p), want)
							}
							if m.TOS != tosOf(got) || m.Src != netip.AddrPortFrom(fam.src, 4503) || m.Dst != netip.AddrPortFrom(fam.dst, 4503) {
								t.Fatalf("packet %d: TOS %#x src %v dst %v", got, m.TOS, m.Src, m.Dst)
							}
							got++
						}
					}
					g := fam.r.(*receiver).gro
					switch {
					case noGSO && g != nil:
						t.Error("UDP_GRO on with NoGSO")
					case !noGSO && (g == nil || g.datagrams >= total/4):
						t.Errorf("%d packets arrived in %d datagrams: GSO/GRO not in effect", total, g.datagrams)
					}
				})
			}
		})
	}
}

// TestRawSendNoAllocs sends raw ESP, IPv4 and IPv6, whole and in
// fragments, through the raw sockets, addressed from each packet's
// endpoint, and checks that a warm Send allocates nothing.
func TestRawSendNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	a, _ := twoNS(t)
	s := openIn(t, a, SocketConfig{Mark: testMark, EncapPort: 4504})
	esp := []byte{0, 0, 0x12, 0x34, 0, 0, 0, 1, 'e', 's', 'p', 'd', 1, 2, 3, 4}
	big := make([]byte, 3000)
	copy(big, esp)
	a4, b4 := netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("198.18.1.2")
	a6, b6 := netip.MustParseAddr("2001:db8:1::1"), netip.MustParseAddr("2001:db8:1::2")
	pkts := []Packet{outPkt(a4, b4, 0, 0, 0, esp), outPkt(a6, b6, 0, 0, 0, esp)}
	for _, p := range []Packet{outPkt(a4, b4, 0, 0, 0, big), outPkt(a6, b6, 0, 0, 0, big)} {
		p.DF, p.FragmentAbove = false, 1280
		pkts = append(pkts, p)
	}
	const want = 1 + 1 + 3 + 3 // two whole packets, two in three fragments each
	send := func() {
		if n, err := s.Send(pkts); n != want || err != nil {
			t.Fatalf("Send: %d, %v; want %d", n, err, want)
		}
	}
	send() // the fragment buffers
	if n := testing.AllocsPerRun(100, send); n != 0 {
		t.Errorf("%.2f allocations per Send of %d raw packets, want 0", n, want)
	}
}
