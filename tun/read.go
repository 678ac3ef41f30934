package tun

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Read reads one or more packets into bufs, each starting at offset, and
// stores their lengths in sizes. len(sizes) >= len(bufs); each buffer must
// hold offset+MTU bytes. It waits for one packet or super-packet, then
// adds what else is queued without waiting (fill), and returns the number
// of packets read: the segments of TSO/USO super-packets count one each,
// and those of a super-packet that does not fit come with the next calls. Errors other than os.ErrClosed concern one read and are
// not fatal.
func (d *Device) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	if !d.vnet {
		n, err := d.dev.Read(bufs, sizes, offset)
		return n, d.closedErr(err)
	}
	if len(bufs) == 0 {
		return 0, nil
	}
	d.rmu.Lock()
	defer d.rmu.Unlock()
	n := 0
	for n == 0 {
		if d.spl.pending() {
			k, err := d.spl.split(bufs, sizes, offset)
			if err != nil {
				d.stats.readPackets.Add(uint64(k))
				return k, err
			}
			n = k
			break
		}
		if err := d.rc.Read(d.readFn); err != nil {
			return 0, d.closedErr(err)
		}
		if d.rerr != nil {
			return 0, d.closedErr(d.rerr)
		}
		d.stats.reads.Add(1)
		k, err := d.spl.start(d.rbuf[:d.rn], bufs[0][offset:], &sizes[0])
		if err != nil {
			return 0, err
		}
		if k == 0 {
			d.stats.superReads.Add(1)
		}
		n = k // 0: a super-packet, split at the top of the loop
	}
	n = d.fill(bufs, sizes, offset, n)
	d.stats.readPackets.Add(uint64(n))
	return n, nil
}

// fill reads what else is queued, without waiting, into the buffers from
// bufs[n] on, packets and super-packets alike, and returns the number of
// buffers filled: a batch of small packets (ACKs, datagrams), or of the
// short super-packets that many TCP senders interleave, travels through
// the pipeline and out of the sockets together rather than one read each.
// It stops at a super-packet whose segments do not all fit (they come
// with the next Read: the read buffer holds them until then).
func (d *Device) fill(bufs [][]byte, sizes []int, offset, n int) int {
	for n < len(bufs) && !d.spl.pending() {
		if err := d.rc.Read(d.tryReadFn); err != nil || d.rerr != nil {
			break // EAGAIN, or an error the next Read reports
		}
		d.stats.reads.Add(1)
		k, err := d.spl.start(d.rbuf[:d.rn], bufs[n][offset:], &sizes[n])
		if err != nil {
			break
		}
		if k == 0 {
			d.stats.superReads.Add(1)
			k, _ = d.spl.split(bufs[n:], sizes[n:], offset)
		}
		n += k
	}
	return n
}

// tryRead reads without waiting: EAGAIN ends the attempt.
func (d *Device) tryRead(fd uintptr) bool {
	n, err := rawRead(fd, d.rbuf)
	if err == unix.EINTR {
		return false
	}
	d.rn, d.rerr = n, err
	if err != nil {
		d.rn = 0
	}
	return true
}

func (d *Device) read(fd uintptr) bool {
	n, err := rawRead(fd, d.rbuf)
	if err == unix.EAGAIN || err == unix.EINTR {
		return false
	}
	d.rn, d.rerr = n, nil
	if err != nil {
		d.rn, d.rerr = 0, err
	}
	return true
}

// rawRead is read(2) on the non-blocking descriptor as a raw system call.
//
// The TUN descriptor, like the data plane's sockets, is non-blocking, so
// none of the data path's system calls can wait: each returns EAGAIN
// instead, and RawConn parks the goroutine on the netpoller. A plain
// Syscall tells the scheduler it may block (entersyscall): when it lasts
// longer than a sysmon tick, as a 64 KiB read, writev or sendmmsg does,
// sysmon hands the P to another thread and the caller has to win it back
// on return, with a thread wakeup each way. The raw call keeps the P; it
// only delays a stop-the-world by its own length. Measured on the harness
// (docs/benchmarks-history.md, "Raw system calls"): gateway CPU per GB
// -16%, idle ping RTT -100 µs.
func rawRead(fd uintptr, b []byte) (int, error) {
	r, _, e := unix.RawSyscall(unix.SYS_READ, fd, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}
