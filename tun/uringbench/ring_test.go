package uringbench

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The io_uring uapi (include/uapi/linux/io_uring.h) that this file uses.
// golang.org/x/sys/unix has the system call numbers but not the structs,
// so they are written out here with the kernel's layout.
const (
	// mmap offsets of the rings (IORING_OFF_*).
	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000

	// featSingleMMap (IORING_FEAT_SINGLE_MMAP): the SQ and CQ rings share
	// one mapping.
	featSingleMMap = 1 << 0

	// enterGetEvents (IORING_ENTER_GETEVENTS): io_uring_enter waits for
	// min_complete completions.
	enterGetEvents = 1 << 0

	// opWrite (IORING_OP_WRITE): write(2) of addr/len to fd.
	opWrite = 23
)

// sqringOffsets is struct io_sqring_offsets: where each field of the
// submission ring lies in its mapping (40 bytes).
type sqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, Resv1 uint32
	UserAddr                                                        uint64
}

// cqringOffsets is struct io_cqring_offsets (40 bytes).
type cqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Overflow, CQEs, Flags, Resv1 uint32
	UserAddr                                                        uint64
}

// params is struct io_uring_params (120 bytes), io_uring_setup's argument
// and result.
type params struct {
	SQEntries, CQEntries, Flags, SQThreadCPU, SQThreadIdle, Features, WQFd uint32
	Resv                                                                   [3]uint32
	SQOff                                                                  sqringOffsets
	CQOff                                                                  cqringOffsets
}

// sqe is struct io_uring_sqe (64 bytes), with the fields a write uses
// named and the unions of the rest kept as their first member.
type sqe struct {
	Opcode      uint8  // 0
	Flags       uint8  // 1: IOSQE_*
	IOPrio      uint16 // 2
	Fd          int32  // 4
	Off         uint64 // 8: file offset (ignored by a TUN)
	Addr        uint64 // 16: buffer
	Len         uint32 // 24: buffer length
	RWFlags     uint32 // 28
	UserData    uint64 // 32: returned in the completion
	BufIndex    uint16 // 40
	Personality uint16 // 42
	SpliceFdIn  int32  // 44
	Addr3       uint64 // 48
	Pad2        uint64 // 56
}

// cqe is struct io_uring_cqe (16 bytes, without IORING_SETUP_CQE32).
type cqe struct {
	UserData uint64
	Res      int32 // the write's return value, or -errno
	Flags    uint32
}

// The uapi sizes, checked at compile time.
var (
	_ [120 - unsafe.Sizeof(params{})]byte
	_ [unsafe.Sizeof(params{}) - 120]byte
	_ [64 - unsafe.Sizeof(sqe{})]byte
	_ [unsafe.Sizeof(sqe{}) - 64]byte
	_ [16 - unsafe.Sizeof(cqe{})]byte
	_ [unsafe.Sizeof(cqe{}) - 16]byte
)

// ring is one io_uring instance used from one goroutine at a time: the
// program is the only producer of the submission ring and the only
// consumer of the completion ring.
type ring struct {
	fd      int
	sqMem   []byte // the SQ ring mapping (and the CQ ring with featSingleMMap)
	cqMem   []byte // the CQ ring mapping when it is separate
	sqeMem  []byte // the SQE array mapping
	sqHead  *uint32
	sqTail  *uint32
	sqMask  uint32
	sqArray []uint32
	sqes    []sqe
	cqHead  *uint32
	cqTail  *uint32
	cqMask  uint32
	cqes    []cqe
	// inflight keeps the buffers of the submissions in flight reachable.
	inflight [][]byte
}

// newRing sets up an io_uring with room for entries submissions.
func newRing(entries uint32) (*ring, error) {
	var p params
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup(%d): %w", entries, errno)
	}
	r := &ring{fd: int(fd)}
	fail := func(err error) (*ring, error) {
		r.close()
		return nil, err
	}
	sqSize := int(p.SQOff.Array + p.SQEntries*4)
	cqSize := int(p.CQOff.CQEs + p.CQEntries*uint32(unsafe.Sizeof(cqe{})))
	if p.Features&featSingleMMap != 0 {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	if r.sqMem, err = unix.Mmap(r.fd, offSQRing, sqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return fail(fmt.Errorf("mmap SQ ring: %w", err))
	}
	cqMem := r.sqMem
	if p.Features&featSingleMMap == 0 {
		if r.cqMem, err = unix.Mmap(r.fd, offCQRing, cqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
			return fail(fmt.Errorf("mmap CQ ring: %w", err))
		}
		cqMem = r.cqMem
	}
	sqeSize := int(p.SQEntries) * int(unsafe.Sizeof(sqe{}))
	if r.sqeMem, err = unix.Mmap(r.fd, offSQEs, sqeSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return fail(fmt.Errorf("mmap SQEs: %w", err))
	}
	u32 := func(mem []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }
	r.sqHead = u32(r.sqMem, p.SQOff.Head)
	r.sqTail = u32(r.sqMem, p.SQOff.Tail)
	r.sqMask = *u32(r.sqMem, p.SQOff.RingMask)
	r.sqArray = unsafe.Slice(u32(r.sqMem, p.SQOff.Array), p.SQEntries)
	r.sqes = unsafe.Slice((*sqe)(unsafe.Pointer(&r.sqeMem[0])), p.SQEntries)
	r.cqHead = u32(cqMem, p.CQOff.Head)
	r.cqTail = u32(cqMem, p.CQOff.Tail)
	r.cqMask = *u32(cqMem, p.CQOff.RingMask)
	r.cqes = unsafe.Slice((*cqe)(unsafe.Pointer(&cqMem[p.CQOff.CQEs])), p.CQEntries)
	return r, nil
}

// close unmaps the rings and closes the ring's file descriptor.
func (r *ring) close() {
	for _, m := range [][]byte{r.sqeMem, r.cqMem, r.sqMem} {
		if m != nil {
			unix.Munmap(m)
		}
	}
	if r.fd >= 0 {
		unix.Close(r.fd)
		r.fd = -1
	}
}

// writeBatch queues one IORING_OP_WRITE of each of bufs to fd, submits
// them and waits for their completions with one io_uring_enter, and
// checks that each wrote its whole buffer. len(bufs) must not exceed the
// ring's entries.
func (r *ring) writeBatch(fd int, bufs [][]byte) error {
	n := uint32(len(bufs))
	if n == 0 {
		return nil
	}
	if n > uint32(len(r.sqes)) {
		return fmt.Errorf("batch of %d exceeds the ring's %d entries", n, len(r.sqes))
	}
	// The kernel has consumed every earlier submission (each batch waits
	// for its completions), so the ring has room for n.
	tail := *r.sqTail
	for i, b := range bufs {
		idx := (tail + uint32(i)) & r.sqMask
		r.sqes[idx] = sqe{
			Opcode:   opWrite,
			Fd:       int32(fd),
			Addr:     uint64(uintptr(unsafe.Pointer(&b[0]))),
			Len:      uint32(len(b)),
			UserData: uint64(i),
		}
		r.sqArray[idx] = idx
	}
	// Publish the entries before the new tail (a release store).
	atomic.StoreUint32(r.sqTail, tail+n)
	r.inflight = bufs
	// RawSyscall6, as tun.Device's writes: a TUN write completes inline
	// (the benchmark reports iou-wrk threads to show it), so the call does
	// not block on them. Were the kernel to punt writes to its workers it
	// would wait for them, and tun/ would need unix.Syscall6 here.
	for submitted := uint32(0); submitted < n; {
		got, _, errno := unix.RawSyscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(n-submitted), uintptr(n-submitted), enterGetEvents, 0, 0)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return fmt.Errorf("io_uring_enter: %w", errno)
		}
		submitted += uint32(got)
	}
	// Wait until all n completions are posted: io_uring_enter returns
	// once min_complete are, but a retried enter may have counted fewer.
	var errs []error
	for done := uint32(0); done < n; {
		head := *r.cqHead
		ctail := atomic.LoadUint32(r.cqTail)
		if head == ctail {
			if _, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), 0, 1, enterGetEvents, 0, 0); errno != 0 && errno != unix.EINTR {
				return fmt.Errorf("io_uring_enter (wait): %w", errno)
			}
			continue
		}
		for ; head != ctail; head++ {
			c := r.cqes[head&r.cqMask]
			want := len(bufs[c.UserData])
			switch {
			case c.Res < 0:
				errs = append(errs, fmt.Errorf("write %d: %w", c.UserData, unix.Errno(-c.Res)))
			case int(c.Res) != want:
				errs = append(errs, fmt.Errorf("write %d: wrote %d of %d bytes", c.UserData, c.Res, want))
			}
			done++
		}
		atomic.StoreUint32(r.cqHead, head)
	}
	r.inflight = nil
	runtime.KeepAlive(bufs)
	return errors.Join(errs...)
}
