package control

import (
	sockets "github.com/espd/espd/conn"
	"github.com/espd/espd/control/wire"
)

// IKEBackend is implemented by a Backend that owns the IKE ports (espd
// --ike-handoff). Without it, IKE_REGISTER gets EOPNOTSUPP.
type IKEBackend interface {
	// RegisterIKE makes the caller the receiver of the IKE datagrams
	// espd's UDP sockets receive, queueing up to queue of them. A newer
	// registration replaces an older one, whose session is then closed.
	RegisterIKE(queue int) (IKESession, error)
}

// IKESession is one IKE hand-off registration.
type IKESession interface {
	// Packets delivers received IKE datagrams; it is closed when the
	// session ends (Close, or a newer registration).
	Packets() <-chan sockets.IKEPacket
	// Send sends a datagram from one of espd's IKE ports.
	Send(p sockets.IKEPacket) error
	// Ports returns the IKE port and the NAT-T port.
	Ports() (ike, natt uint16)
	// Close ends the session; it is safe to call more than once.
	Close()
}

// ikeReg is a connection's IKE hand-off registration: the session and the
// goroutine that forwards its datagrams as IKE_PACKET messages.
type ikeReg struct {
	sess IKESession
	done chan struct{}
}

// ikeRegistered reports whether the connection is registered for the IKE
// hand-off.
func (c *conn) ikeRegistered() bool {
	c.ikeMu.Lock()
	defer c.ikeMu.Unlock()
	return c.ikeReg != nil
}

// ikeClose ends the connection's IKE hand-off registration, if any, and
// waits for its forwarding goroutine, which a stuck client holds for at
// most WriteTimeout.
func (c *conn) ikeClose() {
	c.ikeMu.Lock()
	reg := c.ikeReg
	c.ikeReg = nil
	c.ikeMu.Unlock()
	if reg == nil {
		return
	}
	reg.sess.Close()
	<-reg.done
}

func handleIKERegister(c *conn, m *wire.Message, r *replier) error {
	ib, ok := c.s.backend.(IKEBackend)
	if !ok {
		return wire.Errorf(wire.EOPNOTSUPP, "IKE hand-off is off: espd owns no IKE ports (start it with --ike-handoff)")
	}
	c.ikeMu.Lock()
	dup := c.ikeReg != nil
	c.ikeMu.Unlock()
	if dup {
		return wire.Errorf(wire.EALREADY, "this connection is already registered for IKE packets")
	}
	sess, err := ib.RegisterIKE(c.s.cfg.EventQueue)
	if err != nil {
		return err
	}
	ike, natt := sess.Ports()
	if err := r.reply(func(b *wire.Builder) { wire.PutIKEPorts(b, ike, natt) }); err != nil {
		sess.Close()
		return err
	}
	reg := &ikeReg{sess: sess, done: make(chan struct{})}
	c.ikeMu.Lock()
	c.ikeReg = reg
	c.ikeMu.Unlock()
	go c.forwardIKE(reg, m.Version, m.Seq)
	return nil
}

// forwardIKE sends the session's datagrams as IKE_PACKET messages (flags
// 0, the IKE_REGISTER's sequence number) until the session ends or a write
// fails (which closes the connection). A session that ends without the
// client asking (a newer registration took over) is announced with an
// IKE_UNREGISTER message of the same sequence number.
func (c *conn) forwardIKE(reg *ikeReg, version uint8, seq uint32) {
	defer close(reg.done)
	defer func() {
		c.ikeMu.Lock()
		mine := c.ikeReg == reg
		if mine {
			c.ikeReg = nil
		}
		c.ikeMu.Unlock()
		if mine {
			if msg, err := wire.NewBuilder(version, wire.MsgIKEUnregister, 0, seq).Bytes(); err == nil {
				c.write(msg)
			}
		}
	}()
	for p := range reg.sess.Packets() {
		b := wire.NewBuilder(version, wire.MsgIKEPacket, 0, seq)
		wire.PutIKEPacket(b, p.Src, p.Dst, p.Data)
		msg, err := b.Bytes()
		if err != nil {
			c.s.cfg.Logf("control: IKE packet from %v not forwarded: %v", p.Src, err)
			continue
		}
		if c.write(msg) != nil {
			c.ikeMu.Lock()
			if c.ikeReg == reg {
				c.ikeReg = nil
			}
			c.ikeMu.Unlock()
			reg.sess.Close()
			for range reg.sess.Packets() {
			}
			return
		}
	}
}

// handleIKEPacket sends a datagram for the client. Like a datagram it gets
// no reply when it was sent, only an ERROR when it was not.
func handleIKEPacket(c *conn, m *wire.Message, r *replier) error {
	c.ikeMu.Lock()
	reg := c.ikeReg
	c.ikeMu.Unlock()
	if reg == nil {
		return wire.Errorf(wire.EPROTO, "IKE_PACKET before IKE_REGISTER on this connection")
	}
	src, dst, data, err := wire.ReadIKEPacket(m.Attrs)
	if err != nil {
		return err
	}
	return reg.sess.Send(sockets.IKEPacket{Src: src, Dst: dst, Data: data})
}

func handleIKEUnregister(c *conn, m *wire.Message, r *replier) error {
	c.ikeMu.Lock()
	ok := c.ikeReg != nil
	c.ikeMu.Unlock()
	if !ok {
		return wire.Errorf(wire.ENOENT, "not registered for IKE packets")
	}
	c.ikeClose()
	return r.reply(nil)
}
