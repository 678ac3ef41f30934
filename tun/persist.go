package tun

import (
	"errors"
	"fmt"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// SetPersist makes the interface persistent (TUNSETPERSIST) or not. A
// persistent interface stays in the kernel, up, with its addresses and the
// routes into it, when its device is closed (Close, or the process's
// exit); while no process has it open the kernel drops what is routed into
// it and counts it in the interface's tx_dropped. Create with its name
// attaches to it again. After SetPersist(false), Close removes it.
func (d *Device) SetPersist(on bool) error {
	f, ok := d.dev.(interface{ File() *os.File })
	if !ok {
		return errors.New("tun: the driver gives no descriptor to make persistent")
	}
	rc, err := f.File().SyscallConn()
	if err != nil {
		return fmt.Errorf("tun: %w", err)
	}
	v := 0
	if on {
		v = 1
	}
	var ioErr error
	if err := rc.Control(func(fd uintptr) { ioErr = unix.IoctlSetInt(int(fd), unix.TUNSETPERSIST, v) }); err != nil {
		return fmt.Errorf("tun: %w", err)
	}
	if ioErr != nil {
		return fmt.Errorf("tun: persist %v on %s: %w", on, d.name, ioErr)
	}
	return nil
}

// ErrNotTUN is returned (wrapped) by Delete for an interface that is not a
// TUN device.
var ErrNotTUN = errors.New("not a TUN device")

// Delete removes the TUN interface name, persistent or not, in the calling
// thread's network namespace. An interface that does not exist is not an
// error (os.ErrNotExist is returned wrapped only by a caller's choice: it
// returns nil); one that is not a TUN device is refused with ErrNotTUN.
func Delete(name string) error {
	h, err := netlink.NewHandle()
	if err != nil {
		return fmt.Errorf("tun: netlink: %w", err)
	}
	defer h.Close()
	link, err := h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("tun: find link %s: %w", name, err)
	}
	if t, ok := link.(*netlink.Tuntap); !ok || t.Mode != netlink.TUNTAP_MODE_TUN {
		return fmt.Errorf("tun: %s (%s): %w", name, link.Type(), ErrNotTUN)
	}
	if err := h.LinkDel(link); err != nil {
		return fmt.Errorf("tun: delete %s: %w", name, err)
	}
	return nil
}
