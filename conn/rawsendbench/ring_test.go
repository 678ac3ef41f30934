package rawsendbench

import (
	"fmt"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The TX ring's layout: frames of ringFrame bytes, two per 4 KiB block,
// one frame per packet of a batch. A frame starts with struct
// tpacket2_hdr (tp_status, tp_len at byte 4); the packet follows at
// ringDataOff (TPACKET2_HDRLEN less struct sockaddr_ll: 52 - 20).
const (
	ringFrame   = 2048
	ringBlock   = 4096
	ringDataOff = 32

	tpStatusAvailable   = 0
	tpStatusSendRequest = 1
)

// ringSender is AF_PACKET SOCK_DGRAM with a TPACKET_V2 TX ring: a batch is
// copied into the ring's frames and sent with one sendto, which returns
// once the kernel has sent every frame.
type ringSender struct {
	fd   int
	ring []byte
	sll  *unix.RawSockaddrLinklayer
}

func newRingSender(tb testing.TB, bd *bed) sender {
	fd := socketIn(tb, bd.a, unix.AF_PACKET, unix.SOCK_DGRAM, 0)
	if err := unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_VERSION, unix.TPACKET_V2); err != nil {
		tb.Fatal(err)
	}
	req := unix.TpacketReq{Block_size: ringBlock, Block_nr: batch * ringFrame / ringBlock, Frame_size: ringFrame, Frame_nr: batch}
	if err := unix.SetsockoptTpacketReq(fd, unix.SOL_PACKET, unix.PACKET_TX_RING, &req); err != nil {
		tb.Fatal(err)
	}
	ring, err := unix.Mmap(fd, 0, batch*ringFrame, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { unix.Munmap(ring) })
	return &ringSender{fd: fd, ring: ring, sll: packetAddr(bd)}
}

func (s *ringSender) send(pkts [][]byte) error {
	for i, p := range pkts {
		f := s.ring[i*ringFrame : (i+1)*ringFrame]
		status := (*uint32)(unsafe.Pointer(&f[0]))
		if st := atomic.LoadUint32(status); st != tpStatusAvailable {
			return fmt.Errorf("ring frame %d has status %#x, want available", i, st)
		}
		copy(f[ringDataOff:], p)
		*(*uint32)(unsafe.Pointer(&f[4])) = uint32(len(p))
		atomic.StoreUint32(status, tpStatusSendRequest)
	}
	_, _, e := unix.Syscall6(unix.SYS_SENDTO, uintptr(s.fd), 0, 0, 0, uintptr(unsafe.Pointer(s.sll)), unix.SizeofSockaddrLinklayer)
	if e != 0 {
		return fmt.Errorf("sendto: %w", e)
	}
	return nil
}
