package tun

import (
	"fmt"

	"github.com/vishvananda/netlink"
)

// The TUN's transmit queue: the packets the kernel routed into the
// interface that espd has not read yet. The kernel holds them in a ring of
// txqueuelen entries (a TSO super-packet is one entry) and drops what
// arrives while it is full, counting it in the interface's tx_dropped; the
// qdisc in front never holds a packet back, because the TUN driver never
// stops its queue. So the ring is the gateway's egress queue towards the
// tunnels, with no queue management: a short one drops the bursts of many
// TCP senders (each drop a retransmission for a sender and a congestion
// signal), a long one adds delay under load (docs/benchmarks-history.md,
// "The TUN's transmit queue, batched reads and io_uring writes": 256 TCP streams
// through 256 tunnels on one gateway, 500 entries against 2000).
const (
	// DefaultTxQueueLen is the ring's length espd sets: twice the TUN's
	// kernel default (500), as long as an Ethernet interface's default
	// queue.
	DefaultTxQueueLen = 1000
	// MaxTxQueueLen bounds Config.TxQueueLen: the kernel allocates the
	// ring at once, one pointer per entry.
	MaxTxQueueLen = 1 << 16
)

// checkTxQueueLen fills in the default and checks the range.
func checkTxQueueLen(n *int) error {
	if *n == 0 {
		*n = DefaultTxQueueLen
	}
	if *n < 1 || *n > MaxTxQueueLen {
		return fmt.Errorf("tun: txqueuelen %d out of range 1..%d", *n, MaxTxQueueLen)
	}
	return nil
}

// setTxQueueLen sets the interface's txqueuelen; the kernel resizes the
// ring of an attached TUN at once.
func setTxQueueLen(h *netlink.Handle, link netlink.Link, n int) error {
	if link.Attrs().TxQLen == n {
		return nil
	}
	if err := h.LinkSetTxQLen(link, n); err != nil {
		return fmt.Errorf("tun: set %s txqueuelen %d: %w", link.Attrs().Name, n, err)
	}
	return nil
}

// queueDrops reads the interface's tx_dropped: the packets the kernel
// routed into the TUN and dropped because the ring was full (or, before
// espd attached, because nobody read the device).
// The handle is the one Create opened, in the device's namespace.
func (d *Device) queueDrops() (uint64, error) {
	d.nlmu.Lock()
	defer d.nlmu.Unlock()
	if d.nl == nil {
		return 0, nil
	}
	link, err := d.nl.LinkByIndex(d.index)
	if err != nil {
		return 0, fmt.Errorf("tun: link %s: %w", d.name, err)
	}
	if s := link.Attrs().Statistics; s != nil {
		return s.TxDropped, nil
	}
	return 0, nil
}
