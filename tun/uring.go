package tun

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A minimal io_uring, through which Write hands the kernel the packets of
// one call with one io_uring_enter instead of one writev each (writeURing
// in write.go). golang.org/x/sys/unix has the system call numbers but not
// the uapi structs (include/uapi/linux/io_uring.h), so those are written
// out here with the kernel's layout, as far as a write needs them. The
// ring takes no flags that a Linux 5.1 kernel lacks; IORING_SETUP_
// SINGLE_ISSUER would not do, as the goroutines that write move between
// threads.

// ringEntries is the size of a Device's submission ring: the writes one
// io_uring_enter submits at most (a Write with more takes several).
const ringEntries = 128

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

	// opWritev (IORING_OP_WRITEV): writev(2) of the addr/len iovecs to fd.
	opWritev = 2
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

// ringParams is struct io_uring_params (120 bytes), io_uring_setup's
// argument and result.
type ringParams struct {
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
	Off         uint64 // 8: file offset (a TUN ignores it)
	Addr        uint64 // 16: the iovecs
	Len         uint32 // 24: their number
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
	_ [120 - unsafe.Sizeof(ringParams{})]byte
	_ [unsafe.Sizeof(ringParams{}) - 120]byte
	_ [64 - unsafe.Sizeof(sqe{})]byte
	_ [unsafe.Sizeof(sqe{}) - 64]byte
	_ [16 - unsafe.Sizeof(cqe{})]byte
	_ [unsafe.Sizeof(cqe{}) - 16]byte
)

// resPending is the result of a write that was queued but not submitted
// (io_uring_enter failed before the kernel took it): no errno is this.
const resPending = -1 << 31

// ring is one io_uring instance, used by one goroutine at a time (the
// Write holding the Device's wmu): the program is the only producer of the
// submission ring and the only consumer of the completion ring, and each
// submit waits for all its completions, so both rings are empty between
// submits.
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
	queued  uint32 // entries queued since the last submit
}

// ringSetup is newRing; tests replace it to see the kernel refuse.
var ringSetup = newRing

// newRing sets up an io_uring with room for entries submissions. The
// error wraps io_uring_setup's errno: ENOSYS without io_uring, EPERM when
// a seccomp filter or kernel.io_uring_disabled refuses it.
func newRing(entries uint32) (*ring, error) {
	var p ringParams
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
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
		return fail(fmt.Errorf("io_uring: mmap SQ ring: %w", err))
	}
	cqMem := r.sqMem
	if p.Features&featSingleMMap == 0 {
		if r.cqMem, err = unix.Mmap(r.fd, offCQRing, cqSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
			return fail(fmt.Errorf("io_uring: mmap CQ ring: %w", err))
		}
		cqMem = r.cqMem
	}
	sqeSize := int(p.SQEntries) * int(unsafe.Sizeof(sqe{}))
	if r.sqeMem, err = unix.Mmap(r.fd, offSQEs, sqeSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return fail(fmt.Errorf("io_uring: mmap SQEs: %w", err))
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
	if len(r.cqes) < len(r.sqes) {
		return fail(fmt.Errorf("io_uring: %d completion entries for %d submission entries", len(r.cqes), len(r.sqes)))
	}
	return r, nil
}

// entries returns the number of writes one submit takes at most.
func (r *ring) entries() int { return len(r.sqes) }

// close unmaps the rings and closes the ring's file descriptor.
func (r *ring) close() {
	for _, m := range [][]byte{r.sqeMem, r.cqMem, r.sqMem} {
		if m != nil {
			unix.Munmap(m)
		}
	}
	r.sqeMem, r.cqMem, r.sqMem = nil, nil, nil
	if r.fd >= 0 {
		unix.Close(r.fd)
		r.fd = -1
	}
}

// queueWritev queues an IORING_OP_WRITEV of the n iovecs at iov to fd,
// whose completion goes to res[user] at submit. The iovecs and what they
// point at must stay put until submit returns. At most entries() writes
// may be queued between submits.
func (r *ring) queueWritev(fd int, iov *unix.Iovec, n int, user int) {
	idx := (*r.sqTail + r.queued) & r.sqMask
	r.sqes[idx] = sqe{
		Opcode:   opWritev,
		Fd:       int32(fd),
		Addr:     uint64(uintptr(unsafe.Pointer(iov))),
		Len:      uint32(n),
		UserData: uint64(user),
	}
	r.sqArray[idx] = idx
	r.queued++
}

// submit hands the queued writes to the kernel and waits until each has
// completed, storing each one's result (bytes written, or -errno) in
// res[user]. It returns the number of io_uring_enter calls made and, if
// io_uring_enter itself failed, its error: the writes it had not taken
// are then withdrawn from the ring and keep resPending in res, for the
// caller to write another way.
func (r *ring) submit(res []int32) (enters int, err error) {
	n := r.queued
	r.queued = 0
	if n == 0 {
		return 0, nil
	}
	tail := *r.sqTail
	for i := range n {
		res[r.sqes[(tail+i)&r.sqMask].UserData] = resPending
	}
	// Publish the entries before the new tail (a release store).
	atomic.StoreUint32(r.sqTail, tail+n)
	// A TUN write completes inline, while io_uring_enter submits it (the
	// descriptor is non-blocking, so the kernel neither waits nor hands
	// the write to a worker thread), and the completions are posted before
	// it returns. So the call that submits does not wait for them, and
	// needs no GETEVENTS; it is raw, as the writev it replaces (rawRead in
	// read.go says why). Were a completion to be late, the wait below
	// is an ordinary, blocking system call.
	submitted := uint32(0)
	for submitted < n {
		got, _, errno := unix.RawSyscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(n-submitted), 0, 0, 0, 0)
		enters++
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			// Withdraw what the kernel did not take: it consumes the
			// ring from its head, so moving the tail back to the head
			// leaves it nothing.
			atomic.StoreUint32(r.sqTail, atomic.LoadUint32(r.sqHead))
			err = fmt.Errorf("io_uring_enter: %w", errno)
			break
		}
		if got == 0 {
			atomic.StoreUint32(r.sqTail, atomic.LoadUint32(r.sqHead))
			err = errors.New("io_uring_enter: submitted nothing")
			break
		}
		submitted += uint32(got)
	}
	for done := uint32(0); done < submitted; {
		head := *r.cqHead
		ctail := atomic.LoadUint32(r.cqTail)
		if head == ctail {
			_, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), 0, 1, enterGetEvents, 0, 0)
			enters++
			if errno != 0 && errno != unix.EINTR {
				// Only a broken ring fails a wait; the writes may
				// still be in flight, so their buffers must not be
				// given back. Nothing sane is left to do.
				panic(fmt.Sprintf("tun: io_uring_enter waiting for %d writes: %v", submitted-done, errno))
			}
			continue
		}
		for ; head != ctail; head++ {
			c := &r.cqes[head&r.cqMask]
			res[c.UserData] = c.Res
			done++
		}
		// Give the entries back (a release store).
		atomic.StoreUint32(r.cqHead, head)
	}
	return enters, err
}
