package dataplane

import (
	"errors"
	"fmt"
	"maps"
	"sync/atomic"
)

// An iface is a TUN the pipeline reads cleartext from and writes it to:
// espd's policy-based TUN (id 0, IO.TUN) or a route-based interface
// (AddInterface). Its packets are looked up among the policies of its ID
// only, and an inbound state's packets are written to the interface of the
// state's ID (sa.Config.IfID).
type iface struct {
	id      uint32
	tun     TUN
	closing atomic.Bool   // RemoveInterface: its reader's errors are expected
	done    chan struct{} // closed when its reader returns
}

// ifaceMap is the route-based interfaces by ID, replaced whole on a change.
type ifaceMap map[uint32]*iface

// errNoInterfaceID: interface ID 0 is the policy-based TUN.
var errNoInterfaceID = errors.New("dataplane: interface ID 0 is espd's policy-based TUN, not a route-based interface")

// AddInterface starts carrying the route-based interface ifID on t (XFRM
// interface semantics, docs/architecture.md, "Route-based interfaces"):
// the packets read from t are matched against the policies of ifID only,
// and the packets of inbound states with that ID are written to t. The
// Device owns t from then on and closes it in RemoveInterface or Close
// (a persistent TUN stays in the kernel: see tun.Device.SetPersist).
func (d *Device) AddInterface(ifID uint32, t TUN) error {
	if ifID == 0 {
		return errNoInterfaceID
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case !d.started || d.closed:
		return errors.New("dataplane: AddInterface on a device that is not running")
	case d.ifaces.Load() != nil && (*d.ifaces.Load())[ifID] != nil:
		return fmt.Errorf("dataplane: interface ID %d is carried already", ifID)
	case t.MTU() > BufferSize-MaxFraming:
		return fmt.Errorf("dataplane: interface ID %d: MTU %d above %d", ifID, t.MTU(), BufferSize-MaxFraming)
	}
	ifc := &iface{id: ifID, tun: t, done: make(chan struct{})}
	m := ifaceMap{}
	if cur := d.ifaces.Load(); cur != nil {
		m = maps.Clone(*cur)
	}
	m[ifID] = ifc
	d.ifaces.Store(&m)
	d.out.wg.Add(1)
	d.wg.Add(1)
	go d.readTUN(ifc)
	return nil
}

// RemoveInterface stops carrying the route-based interface ifID, closes
// its TUN and waits for its reader. Inbound packets of states with that ID
// are dropped from then on (Stats.NoInterface).
func (d *Device) RemoveInterface(ifID uint32) error {
	d.mu.Lock()
	cur := d.ifaces.Load()
	var ifc *iface
	if cur != nil {
		ifc = (*cur)[ifID]
	}
	if ifc == nil || d.closed {
		d.mu.Unlock()
		return fmt.Errorf("dataplane: no interface with ID %d", ifID)
	}
	m := maps.Clone(*cur)
	delete(m, ifID)
	d.ifaces.Store(&m)
	ifc.closing.Store(true)
	err := ifc.tun.Close()
	d.mu.Unlock()
	<-ifc.done
	return err
}

// iface returns the interface a state of ID ifID writes to, or nil.
func (d *Device) iface(ifID uint32) *iface {
	if ifID == 0 {
		return d.main
	}
	if m := d.ifaces.Load(); m != nil {
		return (*m)[ifID]
	}
	return nil
}

// closeInterfaces closes every route-based interface's TUN (Close).
func (d *Device) closeInterfaces() []error {
	var errs []error
	if m := d.ifaces.Load(); m != nil {
		for _, ifc := range *m {
			errs = append(errs, ifc.tun.Close())
		}
	}
	return errs
}
