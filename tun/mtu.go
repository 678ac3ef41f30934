package tun

import (
	"fmt"
	"os"
)

// SetMTU changes the interface's MTU in place (RTM_SETLINK): the
// interface, its index, its addresses and the routes into it stay, so
// nothing routed into it falls through to another route meanwhile. MTU
// returns the new value from then on. A closed device returns
// os.ErrClosed.
func (d *Device) SetMTU(mtu int) error {
	if mtu < 576 || mtu > 65535 {
		return fmt.Errorf("tun: MTU %d out of range 576..65535", mtu)
	}
	d.nlmu.Lock()
	defer d.nlmu.Unlock()
	if d.nl == nil {
		return os.ErrClosed
	}
	link, err := d.nl.LinkByIndex(d.index)
	if err != nil {
		return fmt.Errorf("tun: find link %s: %w", d.name, err)
	}
	if err := d.nl.LinkSetMTU(link, mtu); err != nil {
		return fmt.Errorf("tun: set the MTU of %s to %d: %w", d.name, mtu, err)
	}
	d.mtu.Store(int32(mtu))
	return nil
}
