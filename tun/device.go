// Package tun opens the TUN device through which espd exchanges cleartext
// packets with the kernel.
//
// It wraps golang.zx2c4.com/wireguard/tun, wireguard-go's TUN driver, rather
// than github.com/songgao/water. Both open /dev/net/tun, but water reads and
// writes one packet per system call and knows nothing of offloads, so a TCP
// stream through it costs two syscalls per MTU-sized segment. The wireguard
// driver opens the device with IFF_VNET_HDR and enables TSO/USO and checksum
// offload: the kernel hands it TCP/UDP super-packets of up to 64 KiB that it
// splits into MTU-sized packets on Read (GSO), and on Write it coalesces
// consecutive segments of the same flow back into one super-packet (GRO).
// Read and Write take vectors of buffers, which is exactly the batch shape
// espd's pipeline moves between its stages.
package tun

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/vishvananda/netlink"
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

// ErrTooManySegments is returned by Read when a super-packet had more
// segments than the buffers given; the packets that fit were returned and
// the device remains usable.
var ErrTooManySegments = wgtun.ErrTooManySegments

// Config says which TUN device to open.
type Config struct {
	// Name of the interface; "" means DefaultName.
	Name string
	// MTU of the interface; 0 means DefaultMTU.
	MTU int
}

// Device is an open TUN interface, up. Read and Write may be called
// concurrently with each other, each from one goroutine at a time.
type Device struct {
	dev   wgtun.Device
	name  string
	index int
	mtu   int

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
	if len(cfg.Name) >= 16 {
		return nil, fmt.Errorf("tun: interface name %q longer than 15 bytes", cfg.Name)
	}
	dev, err := wgtun.CreateTUN(cfg.Name, cfg.MTU)
	if err != nil {
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
	h, err := netlink.NewHandle()
	if err != nil {
		return fail(fmt.Errorf("tun: netlink: %w", err))
	}
	defer h.Close()
	link, err := h.LinkByName(d.name)
	if err != nil {
		return fail(fmt.Errorf("tun: find link %s: %w", d.name, err))
	}
	d.index = link.Attrs().Index
	if err := h.LinkSetUp(link); err != nil {
		return fail(fmt.Errorf("tun: set %s up: %w", d.name, err))
	}
	return d, nil
}

// BatchSize is the largest number of packets one Read returns and the
// number of buffers callers should pass to Read.
func (d *Device) BatchSize() int { return d.dev.BatchSize() }

// Read reads one or more packets into bufs, each starting at offset, and
// stores their lengths in sizes. len(sizes) >= len(bufs); each buffer must
// hold offset+MTU bytes. It returns the number of packets read. An
// ErrTooManySegments error comes with the packets that did fit; other
// errors other than os.ErrClosed concern one read and are not fatal.
func (d *Device) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	return d.dev.Read(bufs, sizes, offset)
}

// Write writes the packets bufs[i][offset:], coalescing TCP and UDP
// segments of the same flow where the buffers' capacity allows (so it may
// modify bufs, beyond len, up to cap). offset must be at least
// MinWriteOffset. The error joins the failures of individual packets.
func (d *Device) Write(bufs [][]byte, offset int) error {
	if offset < MinWriteOffset {
		return fmt.Errorf("tun: write offset %d below %d", offset, MinWriteOffset)
	}
	_, err := d.dev.Write(bufs, offset)
	if errors.Is(err, os.ErrClosed) {
		return os.ErrClosed
	}
	return err
}

// MTU returns the MTU the device was configured with.
func (d *Device) MTU() int { return d.mtu }

// Name returns the interface name.
func (d *Device) Name() string { return d.name }

// Index returns the interface index.
func (d *Device) Index() int { return d.index }

// Close closes the device; the kernel removes the interface. Pending and
// later Reads and Writes return os.ErrClosed.
func (d *Device) Close() error {
	d.closeOnce.Do(func() {
		d.closeErr = d.dev.Close()
		<-d.drained
	})
	return d.closeErr
}
