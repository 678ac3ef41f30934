package tun

import (
	"errors"
	"os"
	"syscall"
)

// closedErr maps the errors of a closed or removed device to os.ErrClosed.
func (d *Device) closedErr(err error) error {
	if err != nil && (d.closing.Load() || errors.Is(err, syscall.EBADFD) || errors.Is(err, os.ErrClosed)) {
		return os.ErrClosed
	}
	return err
}

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
