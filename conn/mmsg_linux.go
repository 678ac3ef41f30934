package conn

import (
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mmsghdr is struct mmsghdr of recvmmsg(2) and sendmmsg(2).
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
}

// mmsgConn is a socket driven with recvmmsg/sendmmsg through the runtime
// poller. Its vectors are allocated once; the poller callbacks are method
// values bound once, so a call allocates nothing.
type mmsgConn struct {
	file *os.File
	rc   syscall.RawConn

	hdrs  []mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet6 // large enough for either family
	oob   []byte                  // oobSize bytes per message

	// state of the call in progress, read by the callbacks
	off   int
	n     int
	flags int
	count int
	errno syscall.Errno

	readFn, writeFn func(uintptr) bool

	counts *ioCounts // nil: not counted
}

// ioCounts count the outer sockets' system calls and what they carried,
// to tell the batch sizes achieved (Stats).
type ioCounts struct {
	recvCalls, recvDatagrams atomic.Uint64
	sendCalls, sendMessages  atomic.Uint64
}

func (c *ioCounts) recv(datagrams int) {
	if c != nil {
		c.recvCalls.Add(1)
		c.recvDatagrams.Add(uint64(datagrams))
	}
}

func (c *ioCounts) send(messages int) {
	if c != nil {
		c.sendCalls.Add(1)
		c.sendMessages.Add(uint64(messages))
	}
}

const oobSize = 128

// newMmsgConn wraps the non-blocking socket fd for batches of up to
// batch messages.
func newMmsgConn(fd int, name string, batch int) (*mmsgConn, error) {
	f := os.NewFile(uintptr(fd), name)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, err
	}
	c := &mmsgConn{
		file:  f,
		rc:    rc,
		hdrs:  make([]mmsghdr, batch),
		iovs:  make([]unix.Iovec, batch),
		names: make([]unix.RawSockaddrInet6, batch),
		oob:   make([]byte, batch*oobSize),
	}
	c.readFn = c.recvmmsg
	c.writeFn = c.sendmmsg
	return c, nil
}

func (c *mmsgConn) recvmmsg(fd uintptr) bool {
	// Raw: the socket is non-blocking (a blocking call would hold its thread; the poller waits instead).
	r, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&c.hdrs[0])), uintptr(c.n), uintptr(c.flags), 0, 0)
	if e == unix.EAGAIN || e == unix.EINTR {
		return false
	}
	c.count, c.errno = int(r), e
	return true
}

func (c *mmsgConn) sendmmsg(fd uintptr) bool {
	// Raw: the socket is non-blocking (a blocking call would hold its thread; the poller waits instead).
	r, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&c.hdrs[c.off])), uintptr(c.n), uintptr(c.flags), 0, 0)
	if e == unix.EAGAIN || e == unix.EINTR {
		return false
	}
	c.count, c.errno = int(r), e
	return true
}

// recv runs recvmmsg on the first n prepared headers, waiting until at
// least one message arrives.
func (c *mmsgConn) recv(n int) (int, error) {
	c.n, c.flags = n, unix.MSG_DONTWAIT
	if err := c.rc.Read(c.readFn); err != nil {
		return 0, err
	}
	if c.errno != 0 {
		return 0, c.errno
	}
	c.counts.recv(c.count)
	return c.count, nil
}

// sendFrom runs sendmmsg on the n prepared headers from off on, waiting
// while the socket buffer is full. It returns how many were sent; an error
// concerns the first message not sent.
func (c *mmsgConn) sendFrom(off, n int) (int, error) {
	c.off, c.n, c.flags = off, n, unix.MSG_DONTWAIT
	if err := c.rc.Write(c.writeFn); err != nil {
		return 0, err
	}
	if c.errno != 0 {
		return 0, c.errno
	}
	c.counts.send(c.count)
	return c.count, nil
}

// prepare points message i at buf, with room for the peer's address and
// control messages when recv is true, or with name (nameLen bytes of
// c.names[i]) as destination when sending.
func (c *mmsgConn) prepare(i int, buf []byte, recv bool, nameLen int) {
	iov := &c.iovs[i]
	if len(buf) > 0 {
		iov.Base = &buf[0]
	} else {
		iov.Base = nil
	}
	iov.SetLen(len(buf))
	h := &c.hdrs[i].hdr
	*h = unix.Msghdr{}
	h.Iov = iov
	h.SetIovlen(1)
	h.Name = (*byte)(unsafe.Pointer(&c.names[i]))
	if recv {
		h.Namelen = unix.SizeofSockaddrInet6
		h.Control = &c.oob[i*oobSize]
		h.SetControllen(oobSize)
	} else {
		h.Namelen = uint32(nameLen)
	}
	c.hdrs[i].len = 0
}

// control returns the control messages received with message i.
func (c *mmsgConn) control(i int) []byte {
	return c.oob[i*oobSize : i*oobSize+int(c.hdrs[i].hdr.Controllen)]
}

func (c *mmsgConn) close() error { return c.file.Close() }
