package daemon

import (
	"errors"

	"github.com/espd/espd/control"
	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/ikehub"
)

// The IKE hand-off (espd --ike-handoff): espd owns UDP 500 and the
// encapsulation port, keeps ESP-in-UDP for itself and hands IKE datagrams
// to the IKE daemon (charon's espd plugin) registered on the control
// socket, which sends its own datagrams back the same way (package
// ikehub). UDP-encapsulated ESP thus never passes through charon, and IKE
// never through the TUN.

var _ control.IKEBackend = (*Daemon)(nil)

// startIKE starts the hand-off on the outer sockets if the options ask
// for it; Daemon.ike holds the hub while it runs.
func (d *Daemon) startIKE() error {
	if !d.opts.IKEHandoff {
		return nil
	}
	if d.kio == nil {
		return errors.New("IKE hand-off before the data plane started")
	}
	h, err := ikehub.Start(d.kio.socks, d.opts.IKEPort, d.log.With("component", "ike"))
	if err != nil {
		return err
	}
	d.ike.Store(h)
	return nil
}

// stopIKE ends the registration and closes the IKE port.
func (d *Daemon) stopIKE() error {
	if h := d.ike.Swap(nil); h != nil {
		return h.Stop()
	}
	return nil
}

// RegisterIKE implements control.IKEBackend: the caller receives the IKE
// datagrams from now on; an earlier registration ends.
func (d *Daemon) RegisterIKE(queue int) (control.IKESession, error) {
	h := d.ike.Load()
	if h == nil {
		return nil, wire.Errorf(wire.EOPNOTSUPP, "IKE hand-off is off: espd owns no IKE ports (start it with --ike-handoff)")
	}
	return h.RegisterIKE(queue)
}
