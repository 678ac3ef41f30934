package afxdp

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// frameSize is the size of a UMEM frame; a frame holds the kernel's
// XDP_PACKET_HEADROOM and at most maxFrame bytes of packet (1792: an
// Ethernet MTU of 1500 fits; the program passes larger frames to the
// kernel).
const (
	frameSize = 2048
	maxFrame  = frameSize - unix.XDP_PACKET_HEADROOM
)

// ring is one of an AF_XDP socket's mmapped rings: a producer and a
// consumer index and size entries (size a power of two).
type ring struct {
	mem        []byte
	prod, cons *uint32
	descs      unsafe.Pointer
	mask       uint32
}

func mapRing(fd int, pgoff int64, off *unix.XDPRingOffset, size uint32, entry uintptr) (ring, error) {
	mem, err := unix.Mmap(fd, pgoff, int(off.Desc)+int(size)*int(entry),
		unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return ring{}, err
	}
	return ring{
		mem:   mem,
		prod:  (*uint32)(unsafe.Pointer(&mem[off.Producer])),
		cons:  (*uint32)(unsafe.Pointer(&mem[off.Consumer])),
		descs: unsafe.Pointer(&mem[off.Desc]),
		mask:  size - 1,
	}, nil
}

func (r *ring) unmap() {
	if r.mem != nil {
		unix.Munmap(r.mem)
		r.mem = nil
	}
}

// rxDesc returns entry i of an RX ring.
func (r *ring) rxDesc(i uint32) *unix.XDPDesc {
	return (*unix.XDPDesc)(unsafe.Add(r.descs, uintptr(i&r.mask)*unsafe.Sizeof(unix.XDPDesc{})))
}

// fillAddr returns entry i of a fill ring.
func (r *ring) fillAddr(i uint32) *uint64 {
	return (*uint64)(unsafe.Add(r.descs, uintptr(i&r.mask)*8))
}

// socket is an AF_XDP socket bound to one queue of a device, with its own
// UMEM of frames frames, all of them owned by the kernel (in the fill
// ring or the RX ring) except while Receive copies them out.
type socket struct {
	fd     int
	file   *os.File
	rc     syscall.RawConn
	umem   []byte
	rx     ring
	fill   ring
	comp   ring
	frames uint32
	// ZeroCopy reports a bind in zero-copy mode (the driver writes into
	// the UMEM); otherwise the kernel copies each frame.
	zeroCopy bool

	closeOnce sync.Once
	closeErr  error
}

// openSocket opens an AF_XDP socket on queue of the device ifindex with
// frames UMEM frames (a power of two), trying zero-copy first.
func openSocket(ifindex, queue int, frames uint32) (_ *socket, err error) {
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("AF_XDP socket: %w", err)
	}
	s := &socket{fd: fd, frames: frames}
	defer func() {
		if err != nil {
			s.release()
		}
	}()
	s.umem, err = unix.Mmap(-1, 0, int(frames)*frameSize, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("UMEM: %w", err)
	}
	reg := unix.XDPUmemReg{Addr: uint64(uintptr(unsafe.Pointer(&s.umem[0]))), Len: uint64(len(s.umem)), Size: frameSize}
	if err := setsockopt(fd, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
		if errors.Is(err, unix.ENOBUFS) {
			// The kernel pins the UMEM and counts it against the user's
			// RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK.
			return nil, fmt.Errorf("XDP_UMEM_REG: %w (its %d MiB a queue exceed RLIMIT_MEMLOCK, systemd's LimitMEMLOCK=)", err, len(s.umem)>>20)
		}
		return nil, fmt.Errorf("XDP_UMEM_REG: %w", err)
	}
	for _, opt := range []int{unix.XDP_UMEM_FILL_RING, unix.XDP_UMEM_COMPLETION_RING, unix.XDP_RX_RING} {
		if err := unix.SetsockoptInt(fd, unix.SOL_XDP, opt, int(frames)); err != nil {
			return nil, fmt.Errorf("XDP ring size (option %d): %w", opt, err)
		}
	}
	var off unix.XDPMmapOffsets
	if err := getsockopt(fd, unix.XDP_MMAP_OFFSETS, unsafe.Pointer(&off), unsafe.Sizeof(off)); err != nil {
		return nil, fmt.Errorf("XDP_MMAP_OFFSETS: %w", err)
	}
	if s.rx, err = mapRing(fd, unix.XDP_PGOFF_RX_RING, &off.Rx, frames, unsafe.Sizeof(unix.XDPDesc{})); err != nil {
		return nil, fmt.Errorf("RX ring: %w", err)
	}
	if s.fill, err = mapRing(fd, unix.XDP_UMEM_PGOFF_FILL_RING, &off.Fr, frames, 8); err != nil {
		return nil, fmt.Errorf("fill ring: %w", err)
	}
	if s.comp, err = mapRing(fd, unix.XDP_UMEM_PGOFF_COMPLETION_RING, &off.Cr, frames, 8); err != nil {
		return nil, fmt.Errorf("completion ring: %w", err)
	}
	for i := range frames {
		*s.fill.fillAddr(i) = uint64(i) * frameSize
	}
	atomic.StoreUint32(s.fill.prod, frames)
	if s.zeroCopy, err = bind(fd, ifindex, queue); err != nil {
		return nil, fmt.Errorf("bind to queue %d: %w", queue, err)
	}
	s.file = os.NewFile(uintptr(fd), fmt.Sprintf("xsk-%d-%d", ifindex, queue))
	s.fd = -1 // the file owns it
	if s.rc, err = s.file.SyscallConn(); err != nil {
		return nil, err
	}
	return s, nil
}

// bind binds fd to the queue, in zero-copy mode where the driver has it.
// A socket closed on the queue just before leaves it busy until the
// kernel's deferred release: bind retries for up to busyWait.
func bind(fd, ifindex, queue int) (zeroCopy bool, err error) {
	sa := &unix.SockaddrXDP{Ifindex: uint32(ifindex), QueueID: uint32(queue)}
	deadline := time.Now().Add(busyWait)
	for {
		sa.Flags = unix.XDP_ZEROCOPY
		if err = unix.Bind(fd, sa); err == nil {
			return true, nil
		}
		sa.Flags = unix.XDP_COPY
		if err = unix.Bind(fd, sa); err == nil || !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return false, err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

const busyWait = 5 * time.Second

// stats returns the kernel's counters of the socket.
func (s *socket) stats() (unix.XDPStatistics, error) {
	var st unix.XDPStatistics
	err := s.rc.Control(func(fd uintptr) {
		err := getsockopt(int(fd), unix.XDP_STATISTICS, unsafe.Pointer(&st), unsafe.Sizeof(st))
		if err != nil {
			st = unix.XDPStatistics{}
		}
	})
	return st, err
}

// close closes the socket; a blocked read returns. It waits for a read
// in progress, then unmaps the rings and the UMEM.
func (s *socket) close() error {
	s.closeOnce.Do(func() {
		if s.file != nil {
			s.closeErr = s.file.Close()
		}
		s.release()
	})
	return s.closeErr
}

func (s *socket) release() {
	if s.fd >= 0 {
		unix.Close(s.fd)
		s.fd = -1
	}
	s.rx.unmap()
	s.fill.unmap()
	s.comp.unmap()
	if s.umem != nil {
		unix.Munmap(s.umem)
		s.umem = nil
	}
}

func setsockopt(fd, opt int, p unsafe.Pointer, n uintptr) error {
	_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(p), n, 0)
	if e != 0 {
		return e
	}
	return nil
}

func getsockopt(fd, opt int, p unsafe.Pointer, n uintptr) error {
	l := uint32(n)
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(p), uintptr(unsafe.Pointer(&l)), 0)
	if e != 0 {
		return e
	}
	return nil
}
