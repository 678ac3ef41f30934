package tun

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/packet"
	"github.com/espd/espd/testbed"
)

// batch returns n IPv4 packets of an unassigned protocol (253: not
// coalesced) to an unrouted address, each behind off bytes of room.
func batch(t *testing.T, n, off int) [][]byte {
	t.Helper()
	bufs := make([][]byte, n)
	for i := range bufs {
		bufs[i] = make([]byte, off+100)
		if _, err := packet.PutIPv4Header(bufs[i][off:], packet.IPv4Header{
			TotalLen: 100, ID: uint16(i), TTL: 64, Protocol: 253,
			Src: netip.MustParseAddr("198.18.113.2"), Dst: netip.MustParseAddr("198.18.114.2"),
		}); err != nil {
			t.Fatal(err)
		}
	}
	return bufs
}

func createInternal(t *testing.T, name string) *Device {
	t.Helper()
	ns := testbed.NewNodeT(t, "tun")
	var d *Device
	if err := ns.Do(func() (err error) {
		d, err = Create(Config{Name: name})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// TestURingSetupRefused: where io_uring_setup fails (EPERM, as from
// systemd's SystemCallFilter), Create still succeeds, URingErr says why,
// and Write writes every packet with writev(2).
func TestURingSetupRefused(t *testing.T) {
	ringSetup = func(uint32) (*ring, error) { return nil, fmt.Errorf("io_uring_setup: %w", unix.EPERM) }
	t.Cleanup(func() { ringSetup = newRing })
	d := createInternal(t, "esptest8")
	if err := d.URingErr(); !errors.Is(err, unix.EPERM) {
		t.Fatalf("URingErr %v, want EPERM", err)
	}
	before := d.Stats()
	if err := d.Write(batch(t, 8, 16), 16); err != nil {
		t.Fatal(err)
	}
	if s := d.Stats(); s.Writes-before.Writes != 8 || s.WritePackets-before.WritePackets != 8 || s.URingEnters != 0 {
		t.Errorf("stats %+v, want 8 writes of 8 packets and no io_uring_enter", s)
	}
}

// TestURingEnterRefused: when io_uring_enter fails (here on a descriptor
// that is no io_uring), the writes the kernel did not take are written
// with writev(2), the ring is dropped, and URingErr says why.
func TestURingEnterRefused(t *testing.T) {
	d := createInternal(t, "esptest9")
	if d.URingErr() != nil || d.ring == nil {
		t.Skipf("io_uring unavailable: %v", d.URingErr())
	}
	null, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ringFd := d.ring.fd
	d.ring.fd = null // closed by dropRing
	t.Cleanup(func() { unix.Close(ringFd) })
	bufs := batch(t, 8, 16)
	before := d.Stats()
	if err := d.Write(bufs, 16); err != nil {
		t.Fatal(err)
	}
	s := d.Stats()
	if s.Writes-before.Writes != 8 || s.WritePackets-before.WritePackets != 8 || s.URingEnters-before.URingEnters != 1 {
		t.Errorf("stats %+v, want 8 writes of 8 packets and one io_uring_enter", s)
	}
	if err := d.URingErr(); !errors.Is(err, unix.EOPNOTSUPP) || d.ring != nil {
		t.Fatalf("URingErr %v (ring %v), want EOPNOTSUPP and no ring", err, d.ring)
	}
	if err := d.Write(bufs, 16); err != nil {
		t.Fatal(err)
	}
	if s2 := d.Stats(); s2.Writes-s.Writes != 8 || s2.URingEnters != s.URingEnters {
		t.Errorf("after the ring was dropped: %d writes, %d io_uring_enter", s2.Writes-s.Writes, s2.URingEnters-s.URingEnters)
	}
}
