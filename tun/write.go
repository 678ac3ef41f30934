package tun

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ErrURingOff is URingErr's answer when Config.NoURing turned io_uring off.
var ErrURingOff = errors.New("tun: io_uring turned off (NoURing)")

// Write writes the packets bufs[i][offset:], coalescing TCP segments (and
// UDP datagrams, with USO) of a flow into super-packets (coalesce.go). It
// may modify the offset bytes in front of each packet and the headers of
// the first packet of each super-packet. offset must be at least
// MinWriteOffset. The error joins the failures of individual packets.
//
// When the call comes to two or more writes (packets and super-packets)
// and the kernel has io_uring, they are submitted together with one
// io_uring_enter (writeURing); else each is one writev(2). Either way
// Write returns once the kernel has taken or refused every packet.
func (d *Device) Write(bufs [][]byte, offset int) error {
	if offset < MinWriteOffset {
		return fmt.Errorf("tun: write offset %d below %d", offset, MinWriteOffset)
	}
	if !d.vnet {
		_, err := d.dev.Write(bufs, offset)
		return d.closedErr(err)
	}
	d.wmu.Lock()
	defer d.wmu.Unlock()
	c := &d.co
	c.plan(bufs, offset)
	if d.ring != nil && c.writes(2) >= 2 {
		return d.writeURing(bufs, offset)
	}
	var errs []error
	for i := range bufs {
		m := c.member[i]
		if m >= 0 && c.groups[m].first != i {
			continue // written with its group
		}
		var err error
		if m < 0 || c.groups[m].count == 1 {
			err = d.writeOne(bufs[i][offset-vnetHdrLen:])
		} else {
			err = d.writeGroup(bufs, offset, &c.groups[m])
		}
		if err != nil {
			if err == os.ErrClosed {
				return err
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// writeOne writes one packet, b being its virtio header room and the
// packet.
func (d *Device) writeOne(b []byte) error {
	clear(b[:vnetHdrLen])
	setIov(&d.iov1[0], b)
	d.wiov = d.iov1[:]
	d.stats.writePackets.Add(1)
	return d.writev()
}

// writeGroup writes g as one super-packet; if the kernel refuses it, it
// restores the first packet and writes the packets one by one.
func (d *Device) writeGroup(bufs [][]byte, offset int, g *group) error {
	b := bufs[g.first][offset-vnetHdrLen:]
	copy(d.saved[:], b[:vnetHdrLen+g.hl])
	superHeader(b, g)
	d.iovs = d.groupIovs(d.iovs[:0], bufs, offset, g)
	d.wiov = d.iovs
	err := d.writev()
	if err == nil {
		d.stats.writePackets.Add(uint64(g.count))
		d.stats.superWrites.Add(1)
		return nil
	}
	if err == os.ErrClosed {
		return err
	}
	return d.ungroup(bufs, offset, g, d.saved[:])
}

// groupIovs appends to iovs the vectors of g's super-packet: the first
// packet, with the super-packet's headers, and the payloads of the others.
func (d *Device) groupIovs(iovs []unix.Iovec, bufs [][]byte, offset int, g *group) []unix.Iovec {
	iovs = append(iovs, unix.Iovec{})
	setIov(&iovs[len(iovs)-1], bufs[g.first][offset-vnetHdrLen:])
	for j := d.co.next[g.first]; j >= 0; j = d.co.next[j] {
		iovs = append(iovs, unix.Iovec{})
		setIov(&iovs[len(iovs)-1], bufs[j][offset+g.hl:])
	}
	return iovs
}

// ungroup restores the first packet of g, whose super-packet the kernel
// refused, from saved, and writes g's packets one by one.
func (d *Device) ungroup(bufs [][]byte, offset int, g *group, saved []byte) error {
	b := bufs[g.first][offset-vnetHdrLen:]
	copy(b[:vnetHdrLen+g.hl], saved)
	var errs []error
	for j := g.first; j >= 0; j = d.co.next[j] {
		if err := d.writeOne(bufs[j][offset-vnetHdrLen:]); err != nil {
			if err == os.ErrClosed {
				return err
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// writev writes d.wiov as one packet.
func (d *Device) writev() error {
	if err := d.rc.Write(d.writeFn); err != nil {
		return d.closedErr(err)
	}
	d.stats.writes.Add(1)
	return d.closedErr(d.werr)
}

func (d *Device) write(fd uintptr) bool {
	// Raw: non-blocking, see rawRead.
	_, _, e := unix.RawSyscall(unix.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&d.wiov[0])), uintptr(len(d.wiov)))
	if e == unix.EAGAIN || e == unix.EINTR {
		return false
	}
	d.werr = nil
	if e != 0 {
		d.werr = e
	}
	return true
}

// savedLen is room for the head of a super-packet: virtio header, IP
// header (no options or extension headers) and TCP header (with options).
const savedLen = vnetHdrLen + 60 + 60

// writeOp is one write of a Write through io_uring: a packet, or the
// super-packet of a group.
type writeOp struct {
	pkt  int // index in bufs of the (first) packet
	grp  int // index in the coalescer's groups, or -1: a packet alone
	head int // with grp: index in Device.heads of its saved head
	iov  int // its vectors: Device.iovs[iov : iov+niov]
	niov int
}

// writeURing writes the packets and super-packets of a Write as
// IORING_OP_WRITEV submissions, ringEntries per io_uring_enter, and waits
// for their completions; each completion's result counts and fails as
// the writev it replaces would (Write's other path). A submission the
// kernel did not take, or that completed with EAGAIN (which a TUN does
// not answer: its send buffer is unlimited), is written with writev(2)
// after the others. A super-packet the kernel refused is
// written again as its packets, one by one with writev(2), as writeGroup
// does.
func (d *Device) writeURing(bufs [][]byte, offset int) error {
	c := &d.co
	if cap(d.iovs) < len(bufs) {
		d.iovs = make([]unix.Iovec, 0, len(bufs))
	}
	d.iovs, d.ops = d.iovs[:0], d.ops[:0]
	nheads := 0
	for i := range bufs {
		m := c.member[i]
		if m >= 0 && c.groups[m].first != i {
			continue // written with its group
		}
		op := writeOp{pkt: i, grp: -1, iov: len(d.iovs)}
		b := bufs[i][offset-vnetHdrLen:]
		if m < 0 || c.groups[m].count == 1 {
			clear(b[:vnetHdrLen])
			d.iovs = append(d.iovs, unix.Iovec{})
			setIov(&d.iovs[op.iov], b)
		} else {
			g := &c.groups[m]
			if nheads == len(d.heads) {
				d.heads = append(d.heads, [savedLen]byte{})
			}
			op.grp, op.head = m, nheads
			nheads++
			copy(d.heads[op.head][:], b[:vnetHdrLen+g.hl])
			superHeader(b, g)
			d.iovs = d.groupIovs(d.iovs, bufs, offset, g)
		}
		op.niov = len(d.iovs) - op.iov
		d.ops = append(d.ops, op)
	}
	if cap(d.res) < len(d.ops) {
		d.res = make([]int32, len(d.ops))
	}
	d.res = d.res[:len(d.ops)]
	// Inside the RawConn's Write, which holds a reference to the
	// descriptor, so that Close cannot release its number to another file
	// while the kernel writes: submitURing returns only when every
	// submission has completed.
	d.enterErr = nil
	if err := d.rc.Write(d.uringFn); err != nil {
		return d.closedErr(err)
	}
	if d.enterErr != nil {
		// io_uring_enter refused (a seccomp filter that allows
		// io_uring_setup only, say): writev(2) from now on.
		d.dropRing(d.enterErr)
	}
	var errs []error
	for k := range d.ops {
		op := &d.ops[k]
		var err error
		switch r := d.res[k]; {
		case r == resPending || r == -int32(unix.EAGAIN) || r == -int32(unix.EINTR):
			d.wiov = d.iovs[op.iov : op.iov+op.niov]
			err = d.writev()
		case r < 0:
			d.stats.writes.Add(1)
			err = d.closedErr(unix.Errno(-r))
		default:
			d.stats.writes.Add(1)
		}
		if op.grp < 0 {
			d.stats.writePackets.Add(1)
		} else if g := &c.groups[op.grp]; err == nil {
			d.stats.writePackets.Add(uint64(g.count))
			d.stats.superWrites.Add(1)
		} else if err != os.ErrClosed {
			err = d.ungroup(bufs, offset, g, d.heads[op.head][:vnetHdrLen+g.hl])
		}
		if err != nil {
			if err == os.ErrClosed {
				return err
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// submitURing queues d.ops on the ring and submits them, in runs of the
// ring's entries, each run waiting for its completions.
func (d *Device) submitURing(fd uintptr) bool {
	r := d.ring
	for k := 0; k < len(d.ops); {
		end := min(k+r.entries(), len(d.ops))
		for ; k < end; k++ {
			op := &d.ops[k]
			r.queueWritev(int(fd), &d.iovs[op.iov], op.niov, k)
		}
		enters, err := r.submit(d.res)
		d.stats.uringEnters.Add(uint64(enters))
		if err != nil {
			d.enterErr = err
			for ; k < len(d.ops); k++ {
				d.res[k] = resPending
			}
		}
	}
	return true
}

// initURing sets up the ring through which Write submits its writes,
// unless off or the device is written through the driver. Where the
// kernel refuses io_uring, Write uses writev(2), and URingErr says why.
func (d *Device) initURing(off bool) {
	switch {
	case off:
		d.setRingErr(ErrURingOff)
	case !d.vnet:
		d.setRingErr(errors.New("tun: no IFF_VNET_HDR, the driver writes"))
	default:
		r, err := ringSetup(ringEntries)
		if err != nil {
			d.setRingErr(fmt.Errorf("tun: %w", err))
			return
		}
		d.ring = r
		d.uringFn = d.submitURing
	}
}

// dropRing closes the ring, with err the reason. Under wmu.
func (d *Device) dropRing(err error) {
	if d.ring != nil {
		d.ring.close()
		d.ring = nil
	}
	d.setRingErr(err)
}

func (d *Device) setRingErr(err error) { d.ringErr.Store(&err) }

// URingErr returns nil when Write submits its writes through io_uring,
// and otherwise why it writes with writev(2) (ErrURingOff, io_uring_setup
// refused: ENOSYS without io_uring, EPERM from a seccomp filter or
// kernel.io_uring_disabled), for the daemon to log. After Close it
// returns os.ErrClosed.
func (d *Device) URingErr() error {
	if p := d.ringErr.Load(); p != nil {
		return *p
	}
	return nil
}
