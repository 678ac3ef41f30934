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

// ErrTooManySegments is returned by Read only on a device without
// offloads, from the driver; with offloads a super-packet's segments
// beyond the buffers given come with the next calls.
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

// Device is an open TUN interface, up. Read and Write may be called
// concurrently with each other and from several goroutines.
type Device struct {
	dev   wgtun.Device
	name  string
	index int
	mtu   atomic.Int32 // SetMTU changes it

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

	// io_uring (uring.go, writeURing): the Write holding wmu uses ring;
	// ring is nil where Write uses writev(2) only, and ringErr says why.
	// A Write's other state is its own (write.go).
	wmu     sync.Mutex
	ring    *ring
	ringErr atomic.Pointer[error]

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
	d := &Device{dev: dev, drained: make(chan struct{})}
	d.mtu.Store(int32(cfg.MTU))
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
	d.readFn, d.tryReadFn = d.read, d.tryRead
	return nil
}

// MTU returns the MTU the device was configured with (Create, SetMTU).
func (d *Device) MTU() int { return int(d.mtu.Load()) }

// Name returns the interface name.
func (d *Device) Name() string { return d.name }

// Index returns the interface index.
func (d *Device) Index() int { return d.index }

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
