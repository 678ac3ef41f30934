// Package tun opens the TUN device through which espd exchanges cleartext
// packets with the kernel, and reads and writes it in batches.
//
// wireguard-go's TUN driver (golang.zx2c4.com/wireguard/tun) creates the
// device, with IFF_VNET_HDR, and reports its link events; espd does the rest
// itself. It turns on checksum and TCP segmentation offload (and UDP
// segmentation where the kernel has it, Linux 6.2) and reads and writes the
// descriptor with raw non-blocking system calls, not through the driver. The
// kernel hands Read TCP/UDP super-packets of up to 64 KiB, which Read splits
// into MTU-sized packets over as many calls as the callers' buffers need,
// losing none (vnet.go); after the packet or super-packet it waited for, a
// Read adds what else is queued, without waiting. Write coalesces consecutive segments of a flow into
// one super-packet, written with one writev whose vectors point at the
// packets where they lie: nothing is copied, and a super-packet does not need
// to fit in a caller's buffer (coalesce.go). The writes of one Write, when
// there are two or more, go to the kernel together through an io_uring,
// with one io_uring_enter instead of a writev each (uring.go); where the
// kernel refuses io_uring, and with Config.NoURing, each is a writev. Only
// a device without IFF_VNET_HDR is read and written through the driver, a
// packet at a time. Create sets the length of the kernel's queue in front
// of Read, and Stats reports what the kernel dropped there (queue.go).
//
// A library that reads and writes one packet per system call and knows no
// offloads (github.com/songgao/water) would cost a TCP stream two system
// calls per MTU-sized segment. Read and Write take vectors of buffers,
// exactly the batch shape espd's pipeline moves between its stages.
package tun

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	wgtun "golang.zx2c4.com/wireguard/tun"
)

// Defaults for Config.
const (
	DefaultName = "esp0"
	// DefaultMTU leaves room for the worst ESP overhead (IPv6 outer, UDP
	// encapsulation, CBC IV, padding, 32-byte ICV) inside a 1500-byte path.
	DefaultMTU = 1400
)

// MinWriteOffset is the least offset Write accepts: the driver writes its
// virtio-net header into the bytes in front of each packet.
const MinWriteOffset = 16

// ErrTooManySegments was returned by Read when a super-packet had more
// segments than the buffers given and the rest were lost. Read no longer
// loses them (they come with the next calls) and returns it only on a
// device without offloads, through the driver.
var ErrTooManySegments = wgtun.ErrTooManySegments

// Config says which TUN device to open.
type Config struct {
	// Name of the interface; "" means DefaultName.
	Name string
	// MTU of the interface; 0 means DefaultMTU.
	MTU int
	// TxQueueLen is the length of the interface's transmit queue, the
	// packets routed into it that espd has not read yet (queue.go); 0
	// means DefaultTxQueueLen.
	TxQueueLen int
	// NoURing makes Write use one writev(2) per packet or super-packet
	// even where the kernel has io_uring (uring.go).
	NoURing bool
	// Persist makes the interface persistent (SetPersist): it outlives
	// the device and the process, and drops what is routed into it while
	// nobody has it open.
	Persist bool
}

// ErrURingOff is URingErr's answer when Config.NoURing turned io_uring off.
var ErrURingOff = errors.New("tun: io_uring turned off (NoURing)")

// Device is an open TUN interface, up. Read and Write may be called
// concurrently with each other and from several goroutines.
type Device struct {
	dev   wgtun.Device
	name  string
	index int
	mtu   int

	// The data path: the driver opens the device and watches its state;
	// espd reads and writes the descriptor itself (vnet.go, coalesce.go).
	rc   syscall.RawConn
	vnet bool // IFF_VNET_HDR with TSO (else the driver's Read and Write)
	uso  bool // UDP segmentation offload too

	rmu       sync.Mutex
	rbuf      []byte
	spl       splitter
	rn        int
	rerr      error
	readFn    func(uintptr) bool
	tryReadFn func(uintptr) bool

	wmu     sync.Mutex
	co      coalescer
	iovs    []unix.Iovec
	iov1    [1]unix.Iovec
	wiov    []unix.Iovec   // what write writes: iovs or iov1, or a part
	saved   [savedLen]byte // the head of a super-packet, to undo
	werr    error
	writeFn func(uintptr) bool

	// io_uring (uring.go, writeURing), under wmu; ring is nil where Write
	// uses writev(2) only, and ringErr says why.
	ring     *ring
	ringErr  atomic.Pointer[error]
	ops      []writeOp
	res      []int32          // each op's result, from its completion
	heads    [][savedLen]byte // the heads of the ops' super-packets, to undo
	enterErr error            // io_uring_enter's failure, in submitURing
	uringFn  func(uintptr) bool

	stats stats

	// nl is a netlink handle in the device's namespace, for the
	// interface's own counters (queue.go).
	nlmu sync.Mutex
	nl   *netlink.Handle

	closing   atomic.Bool
	closeOnce sync.Once
	closeErr  error
	drained   chan struct{}
}

// Create opens (creating it if needed) the TUN interface in the calling
// thread's network namespace, sets its MTU and brings it up.
func Create(cfg Config) (*Device, error) {
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	if cfg.MTU == 0 {
		cfg.MTU = DefaultMTU
	}
	if cfg.MTU < 576 || cfg.MTU > 65535 {
		return nil, fmt.Errorf("tun: MTU %d out of range 576..65535", cfg.MTU)
	}
	if err := checkTxQueueLen(&cfg.TxQueueLen); err != nil {
		return nil, err
	}
	if len(cfg.Name) >= 16 {
		return nil, fmt.Errorf("tun: interface name %q longer than 15 bytes", cfg.Name)
	}
	dev, err := wgtun.CreateTUN(cfg.Name, cfg.MTU)
	if err != nil {
		if errors.Is(err, unix.EPERM) && !mayOpen(cloneDevice) {
			err = fmt.Errorf("%w (opening %s is denied by a device cgroup or a security module: under systemd it needs DeviceAllow=%s rw)", err, cloneDevice, cloneDevice)
		} else if errors.Is(err, unix.EPERM) {
			err = fmt.Errorf("%w (needs CAP_NET_ADMIN)", err)
		} else if errors.Is(err, unix.EACCES) {
			err = fmt.Errorf("%w (/dev/net/tun must be readable and writable by espd's user: mode 0666, as udev makes it)", err)
		}
		return nil, fmt.Errorf("tun: create %s: %w", cfg.Name, err)
	}
	d := &Device{dev: dev, mtu: cfg.MTU, drained: make(chan struct{})}
	// The driver reports link events on a small channel and blocks when
	// nobody reads it; drain it for the device's lifetime.
	go func() {
		defer close(d.drained)
		for range dev.Events() {
		}
	}()
	fail := func(err error) (*Device, error) {
		d.Close()
		return nil, err
	}
	if d.name, err = dev.Name(); err != nil {
		return fail(fmt.Errorf("tun: name: %w", err))
	}
	if err := d.initOffloads(); err != nil {
		return fail(err)
	}
	if cfg.Persist {
		if err := d.SetPersist(true); err != nil {
			return fail(err)
		}
	}
	d.initURing(cfg.NoURing)
	h, err := netlink.NewHandle()
	if err != nil {
		return fail(fmt.Errorf("tun: netlink: %w", err))
	}
	d.nl = h
	link, err := h.LinkByName(d.name)
	if err != nil {
		return fail(fmt.Errorf("tun: find link %s: %w", d.name, err))
	}
	d.index = link.Attrs().Index
	if err := setTxQueueLen(h, link, cfg.TxQueueLen); err != nil {
		return fail(err)
	}
	if err := h.LinkSetUp(link); err != nil {
		return fail(fmt.Errorf("tun: set %s up: %w", d.name, err))
	}
	return d, nil
}

// BatchSize is the number of buffers callers should pass to Read (a
// super-packet's segments beyond it come with the next Reads).
func (d *Device) BatchSize() int { return d.dev.BatchSize() }

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

// closedErr maps the errors of a closed or removed device to os.ErrClosed.
func (d *Device) closedErr(err error) error {
	if err != nil && (d.closing.Load() || errors.Is(err, syscall.EBADFD) || errors.Is(err, os.ErrClosed)) {
		return os.ErrClosed
	}
	return err
}

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

// initOffloads takes the descriptor from the driver and turns on checksum
// and TCP segmentation offload, and UDP segmentation offload where the
// kernel has it.
func (d *Device) initOffloads() error {
	f, ok := d.dev.(interface{ File() *os.File })
	if !ok {
		return nil
	}
	rc, err := f.File().SyscallConn()
	if err != nil {
		return fmt.Errorf("tun: %w", err)
	}
	var flags uint16
	var ioErr error
	if err := rc.Control(func(fd uintptr) {
		ifr, err := unix.NewIfreq(d.name)
		if err != nil {
			ioErr = err
			return
		}
		if ioErr = unix.IoctlIfreq(int(fd), unix.TUNGETIFF, ifr); ioErr != nil {
			return
		}
		flags = ifr.Uint16()
		if flags&unix.IFF_VNET_HDR == 0 {
			return
		}
		if unix.IoctlSetInt(int(fd), unix.TUNSETOFFLOAD, offloadsTCP|offloadsUDP) == nil {
			d.uso = true
		} else {
			ioErr = unix.IoctlSetInt(int(fd), unix.TUNSETOFFLOAD, offloadsTCP)
		}
	}); err != nil {
		return fmt.Errorf("tun: %w", err)
	}
	if ioErr != nil {
		return fmt.Errorf("tun: offloads on %s: %w", d.name, ioErr)
	}
	if flags&unix.IFF_VNET_HDR == 0 {
		return nil
	}
	d.rc, d.vnet = rc, true
	d.rbuf = make([]byte, vnetHdrLen+65535)
	d.iovs = make([]unix.Iovec, 0, 256)
	d.co.udp = d.uso
	d.readFn, d.tryReadFn, d.writeFn = d.read, d.tryRead, d.write
	return nil
}

// MTU returns the MTU the device was configured with.
func (d *Device) MTU() int { return d.mtu }

// Name returns the interface name.
func (d *Device) Name() string { return d.name }

// Index returns the interface index.
func (d *Device) Index() int { return d.index }

// Close closes the device; the kernel removes the interface unless it is
// persistent (Config.Persist). Pending and later Reads and Writes return
// os.ErrClosed.
func (d *Device) Close() error {
	d.closing.Store(true)
	d.closeOnce.Do(func() {
		d.closeErr = d.dev.Close()
		<-d.drained
		d.nlmu.Lock()
		if d.nl != nil {
			d.nl.Close()
			d.nl = nil
		}
		d.nlmu.Unlock()
		// A Write waiting for the descriptor has returned now.
		d.wmu.Lock()
		d.dropRing(os.ErrClosed)
		d.wmu.Unlock()
	})
	return d.closeErr
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

// cloneDevice is the TUN clone device the driver opens.
const cloneDevice = "/dev/net/tun"

// mayOpen reports whether the device at path opens for reading and writing
// other than with EPERM, which is what a device cgroup (systemd's
// DevicePolicy= and DeviceAllow=) answers; CAP_NET_ADMIN is needed only
// after the open, to attach the interface.
func mayOpen(path string) bool {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err == nil {
		unix.Close(fd)
	}
	return !errors.Is(err, unix.EPERM)
}
