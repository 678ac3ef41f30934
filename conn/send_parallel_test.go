package conn

import (
	"encoding/binary"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"
)

// holdWrite holds rc's write lock, as a sender waiting in the poller for
// room in the socket's buffer does, until release is closed. It returns
// once the lock is held.
func holdWrite(t *testing.T, rc syscall.RawConn, release <-chan struct{}, wg *sync.WaitGroup) {
	t.Helper()
	entered := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		rc.Write(func(uintptr) bool {
			close(entered)
			<-release
			return true
		})
	}()
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("could not take the socket's write lock within 30 s")
	}
}

// TestSendParallel runs two senders at once, as two shards' in-order
// stages, while another caller is stuck in each sending socket's write
// (holding the descriptor's write lock, as a sender whose socket buffer is
// full does): neither sender waits for the stuck one or for the other, and
// every packet arrives, in each sender's order, on each of the four paths
// (raw ESP and ESP-in-UDP with UDP_SEGMENT, IPv4 and IPv6).
func TestSendParallel(t *testing.T) {
	a, b := twoNS(t)
	// Static neighbours: a packet sent while the kernel resolves one waits
	// in the neighbour's queue, and those sent as it resolves can pass it.
	const mac = "02:00:5e:00:53:02"
	b.MustIP(t, "link", "set", "vb", "address", mac)
	a.MustIP(t, "neigh", "replace", "198.18.1.2", "lladdr", mac, "dev", "va", "nud", "permanent")
	a.MustIP(t, "-6", "neigh", "replace", "2001:db8:1::2", "lladdr", mac, "dev", "va", "nud", "permanent")
	sa := openIn(t, a, SocketConfig{Mark: testMark, EncapPort: 4505})
	sb := openIn(t, b, SocketConfig{Mark: testMark, EncapPort: 4505, RecvBuffer: 8 << 20})
	rb := sb.Receivers() // raw4, udp4, raw6, udp6
	snd := sa.send
	if snd.g4 == nil || snd.g6 == nil || snd.v6 == nil {
		t.Fatal("sender without its UDP or IPv6 sockets")
	}

	release := make(chan struct{})
	var stuck sync.WaitGroup
	defer stuck.Wait() // before the sockets close: Close waits for them
	defer close(release)
	for _, rc := range []syscall.RawConn{snd.v4.rc, snd.v6.rc, snd.g4.rc, snd.g6.rc} {
		holdWrite(t, rc, release, &stuck)
	}

	a4, b4 := netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("198.18.1.2")
	a6, b6 := netip.MustParseAddr("2001:db8:1::1"), netip.MustParseAddr("2001:db8:1::2")
	paths := []struct {
		src, dst netip.Addr
		port     uint16
	}{{a4, b4, 0}, {a4, b4, 4505}, {a6, b6, 0}, {a6, b6, 4505}}
	const senders, rounds, perPath = 2, 25, 8
	spi := func(sender, path int) uint32 { return uint32(0x100 + 4*sender + path) }

	done := make(chan error, senders)
	for s := range senders {
		go func() {
			seq := make([]uint32, len(paths))
			for range rounds {
				var pkts []Packet
				for p, path := range paths {
					for range perPath {
						pl := make([]byte, 200)
						binary.BigEndian.PutUint32(pl, spi(s, p))
						binary.BigEndian.PutUint32(pl[4:], seq[p])
						seq[p]++
						pkts = append(pkts, outPkt(path.src, path.dst, path.port, path.port, 0, pl))
					}
				}
				if n, err := sa.Send(pkts); n != len(pkts) || err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	bound := time.After(30 * time.Second)
	for range senders {
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Send: %v", err)
			}
		case <-bound:
			t.Fatal("a sender waited 30 s: senders wait for a stuck one or for each other")
		}
	}

	// Every packet arrives, in order per sender and path.
	const want = senders * rounds * perPath
	var wg sync.WaitGroup
	errs := make([]error, len(rb))
	next := make([]map[uint32]uint32, len(rb))
	for i, r := range rb {
		next[i] = map[uint32]uint32{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			msgs := make([]Message, 64)
			for j := range msgs {
				msgs[j].Buf = make([]byte, 2048)
			}
			for got := 0; got < want; {
				n, err := r.Receive(msgs)
				if err != nil {
					errs[i] = err
					return
				}
				for _, m := range msgs[:n] {
					if m.Err != nil || m.End-m.Start != 200 {
						continue // not ours
					}
					pl := m.Buf[m.Start:m.End]
					k, sq := binary.BigEndian.Uint32(pl), binary.BigEndian.Uint32(pl[4:])
					if sq != next[i][k] {
						t.Errorf("receiver %d, SPI %#x: sequence %d after %d", i, k, sq, next[i][k])
					}
					next[i][k] = sq + 1
					got++
				}
			}
		}()
	}
	timer := time.AfterFunc(30*time.Second, func() {
		for _, r := range rb {
			r.Close()
		}
	})
	wg.Wait()
	timer.Stop()
	for i := range rb {
		if errs[i] != nil {
			t.Errorf("receiver %d: %v (counts %v)", i, errs[i], next[i])
		}
		for s := range senders {
			if k := spi(s, i); next[i][k] != rounds*perPath {
				t.Errorf("receiver %d: SPI %#x got %d packets, want %d", i, k, next[i][k], rounds*perPath)
			}
		}
	}
}
