package control

import (
	"slices"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/sa"
)

// handle answers one decoded message. It returns an error only when the
// connection must close (a write failed).
func (c *conn) handle(m *wire.Message) error {
	fail := func(err error) error {
		e, ok := err.(*wire.Error)
		if !ok {
			e = &wire.Error{Code: errnoFromError(err), Msg: err.Error(), Attr: attrFromError(err, m.Attrs)}
		}
		return c.sendError(m.Version, m.Seq, m.Type, e)
	}
	if m.Flags&wire.FlagReply != 0 {
		return fail(wire.Errorf(wire.EPROTO, "%v with the reply flag: clients send requests only", m.Type))
	}
	if m.Type != wire.MsgHello && !slices.Contains(wire.SupportedVersions, m.Version) {
		return fail(versionError([]uint8{m.Version}))
	}
	h, ok := handlers[m.Type]
	if !ok {
		switch {
		case m.Type.Reserved():
			return fail(wire.Errorf(wire.EOPNOTSUPP, "%v: message type reserved for IKE packet hand-off, not implemented", m.Type))
		case m.Type == wire.MsgError || m.Type == wire.MsgDone || m.Type == wire.MsgEvent:
			return fail(wire.Errorf(wire.EPROTO, "%v is sent by the server only", m.Type))
		}
		return fail(wire.Errorf(wire.EOPNOTSUPP, "unknown message type 0x%04x", uint16(m.Type)))
	}
	rep := &replier{c: c, m: m}
	if err := h(c, m, rep); err != nil {
		if rep.failed {
			return err
		}
		// An ERROR also ends a multi-part reply that broke off.
		return fail(err)
	}
	return rep.err
}

// replier writes the replies to one request.
type replier struct {
	c      *conn
	m      *wire.Message
	failed bool // a write failed: the connection is closing
	err    error
}

// reply sends the single reply, built by fill.
func (r *replier) reply(fill func(*wire.Builder)) error {
	return r.send(r.m.Type, wire.FlagReply, fill)
}

// part sends one part of a multi-part reply.
func (r *replier) part(fill func(*wire.Builder)) error {
	return r.send(r.m.Type, wire.FlagReply|wire.FlagMulti, fill)
}

// done ends a multi-part reply.
func (r *replier) done() error { return r.send(wire.MsgDone, wire.FlagReply, nil) }

func (r *replier) send(t wire.MsgType, f wire.Flags, fill func(*wire.Builder)) error {
	b := wire.NewBuilder(r.m.Version, t, f, r.m.Seq)
	if fill != nil {
		fill(b)
	}
	msg, err := b.Bytes()
	if err != nil {
		return err
	}
	write := r.c.write
	if f&wire.FlagMulti == 0 {
		write = r.c.writeFinal
	}
	if err := write(msg); err != nil {
		r.failed, r.err = true, err
		return err
	}
	return nil
}

// handler carries out one request type and sends its reply; a returned
// error becomes an ERROR reply.
type handler func(c *conn, m *wire.Message, r *replier) error

var handlers map[wire.MsgType]handler

func init() {
	handlers = map[wire.MsgType]handler{
		wire.MsgHello:        handleHello,
		wire.MsgSAAdd:        handleSAAdd,
		wire.MsgSAUpdate:     handleSAUpdate,
		wire.MsgSADel:        handleSADel,
		wire.MsgSAGet:        handleSAGet,
		wire.MsgSAList:       handleSAList,
		wire.MsgSAFlush:      handleSAFlush,
		wire.MsgSPIAlloc:     handleSPIAlloc,
		wire.MsgPolicyAdd:    handlePolicyAdd,
		wire.MsgPolicyUpdate: handlePolicyUpdate,
		wire.MsgPolicyDel:    handlePolicyDel,
		wire.MsgPolicyGet:    handlePolicyGet,
		wire.MsgPolicyList:   handlePolicyList,
		wire.MsgPolicyFlush:  handlePolicyFlush,
		wire.MsgStats:        handleStats,
		wire.MsgSubscribe:    handleSubscribe,
		wire.MsgUnsubscribe:  handleUnsubscribe,
		// IKE hand-off (ike.go)
		wire.MsgIKERegister:   handleIKERegister,
		wire.MsgIKEPacket:     handleIKEPacket,
		wire.MsgIKEUnregister: handleIKEUnregister,
		wire.MsgPairRole:      handlePairRole,
	}
}

func handleHello(c *conn, m *wire.Message, r *replier) error {
	offered, err := wire.ReadHello(m)
	if err != nil {
		return err
	}
	v, ok := chooseVersion(offered)
	if !ok {
		return versionError(offered)
	}
	r.m.Version = v
	return r.reply(func(b *wire.Builder) {
		wire.PutHelloReply(b, wire.HelloInfo{Version: v, Software: Software, MaxMessageSize: wire.MaxMessageSize})
	})
}

func handleSAAdd(c *conn, m *wire.Message, r *replier) error {
	cfg, err := wire.ReadSAAdd(m.Attrs)
	defer zeroKeys(&cfg)
	if err != nil {
		return err
	}
	if err := c.s.backend.AddSA(cfg); err != nil {
		return err
	}
	return r.reply(nil)
}

func zeroKeys(c *sa.Config) {
	clear(c.EncKey)
	clear(c.IntegKey)
}

func handleSAUpdate(c *conn, m *wire.Message, r *replier) error {
	u, err := wire.ReadSAUpdate(m.Attrs)
	defer zeroKeys(&u.Config)
	if err != nil {
		return err
	}
	cur, err := c.s.backend.GetSA(u.SPI, u.Dst)
	if err != nil {
		return err
	}
	if cur.Stats.State == sa.StateLarval {
		return wire.Errorf(wire.EINVAL, "spi 0x%08x is an SPI reservation, not a state: install it with SA_ADD", u.SPI)
	}
	if err := c.s.backend.UpdateSA(u.Apply(cur.Config)); err != nil {
		return err
	}
	return r.reply(nil)
}

func handleSADel(c *conn, m *wire.Message, r *replier) error {
	spi, dst, err := wire.ReadSAID(m.Attrs)
	if err != nil {
		return err
	}
	if err := c.s.backend.DeleteSA(spi, dst); err != nil {
		return err
	}
	return r.reply(nil)
}

func handleSAGet(c *conn, m *wire.Message, r *replier) error {
	spi, dst, err := wire.ReadSAID(m.Attrs)
	if err != nil {
		return err
	}
	in, err := c.s.backend.GetSA(spi, dst)
	if err != nil {
		return err
	}
	return r.reply(func(b *wire.Builder) { wire.PutSAInfo(b, in) })
}

func handleSAList(c *conn, m *wire.Message, r *replier) error {
	list, err := c.s.backend.ListSAs()
	if err != nil {
		return err
	}
	for _, in := range list {
		if err := r.part(func(b *wire.Builder) { wire.PutSAInfo(b, in) }); err != nil {
			return err
		}
	}
	return r.done()
}

func handleSAFlush(c *conn, m *wire.Message, r *replier) error {
	if err := c.s.backend.FlushSAs(); err != nil {
		return err
	}
	return r.reply(nil)
}

func handleSPIAlloc(c *conn, m *wire.Message, r *replier) error {
	lo, hi, err := wire.ReadSPIRange(m.Attrs)
	if err != nil {
		return err
	}
	spi, err := c.s.backend.AllocSPI(lo, hi)
	if err != nil {
		return err
	}
	return r.reply(func(b *wire.Builder) { wire.PutSPI(b, spi) })
}

func handlePolicyAdd(c *conn, m *wire.Message, r *replier) error {
	p, err := wire.ReadPolicy(m.Attrs)
	if err != nil {
		return err
	}
	p, err = c.s.backend.AddPolicy(p)
	if err != nil {
		return err
	}
	return r.reply(func(b *wire.Builder) { wire.PutPolicy(b, p) })
}

func handlePolicyUpdate(c *conn, m *wire.Message, r *replier) error {
	p, err := wire.ReadPolicy(m.Attrs)
	if err != nil {
		return err
	}
	p, err = c.s.backend.UpdatePolicy(p)
	if err != nil {
		return err
	}
	return r.reply(func(b *wire.Builder) { wire.PutPolicy(b, p) })
}

func handlePolicyDel(c *conn, m *wire.Message, r *replier) error {
	id, err := wire.ReadPolicyID(m.Attrs)
	if err != nil {
		return err
	}
	if err := c.s.backend.DeletePolicy(id); err != nil {
		return err
	}
	return r.reply(nil)
}

func handlePolicyGet(c *conn, m *wire.Message, r *replier) error {
	id, err := wire.ReadPolicyID(m.Attrs)
	if err != nil {
		return err
	}
	p, err := c.s.backend.GetPolicy(id)
	if err != nil {
		return err
	}
	return r.reply(func(b *wire.Builder) { wire.PutPolicy(b, p) })
}

func handlePolicyList(c *conn, m *wire.Message, r *replier) error {
	list, err := c.s.backend.ListPolicies()
	if err != nil {
		return err
	}
	for _, p := range list {
		if err := r.part(func(b *wire.Builder) { wire.PutPolicy(b, p) }); err != nil {
			return err
		}
	}
	return r.done()
}

func handlePolicyFlush(c *conn, m *wire.Message, r *replier) error {
	if err := c.s.backend.FlushPolicies(); err != nil {
		return err
	}
	return r.reply(nil)
}

func handleStats(c *conn, m *wire.Message, r *replier) error {
	spi, dst, one, err := wire.ReadStatsRequest(m.Attrs)
	if err != nil {
		return err
	}
	g, err := c.s.backend.Stats()
	if err != nil {
		return err
	}
	var list []wire.SAInfo
	if one {
		in, err := c.s.backend.GetSA(spi, dst)
		if err != nil {
			return err
		}
		list = []wire.SAInfo{in}
	} else if list, err = c.s.backend.ListSAs(); err != nil {
		return err
	}
	if err := r.part(func(b *wire.Builder) { wire.PutGlobalStats(b, g) }); err != nil {
		return err
	}
	for _, in := range list {
		if err := r.part(func(b *wire.Builder) { wire.PutSAStats(b, in) }); err != nil {
			return err
		}
	}
	return r.done()
}

func handleSubscribe(c *conn, m *wire.Message, r *replier) error {
	if c.sub != nil {
		return wire.Errorf(wire.EALREADY, "already subscribed")
	}
	mask, err := wire.ReadSubscribe(m.Attrs)
	if err != nil {
		return err
	}
	sub, err := c.s.backend.Subscribe(c.s.cfg.EventQueue)
	if err != nil {
		return err
	}
	if err := r.reply(nil); err != nil {
		sub.Close()
		return err
	}
	c.subscribe(sub, m.Version, m.Seq, mask)
	return nil
}

func handleUnsubscribe(c *conn, m *wire.Message, r *replier) error {
	if c.sub == nil {
		return wire.Errorf(wire.ENOENT, "not subscribed")
	}
	c.unsubscribe()
	return r.reply(nil)
}

func handlePairRole(c *conn, m *wire.Message, r *replier) error {
	role, err := wire.ReadPairRole(m.Attrs)
	if err != nil {
		return err
	}
	st, err := c.s.backend.PairRole(role)
	if err != nil {
		return err
	}
	return r.reply(func(b *wire.Builder) { wire.PutPairStatus(b, st) })
}
