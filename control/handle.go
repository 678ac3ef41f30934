package control

import (
	"fmt"
	"slices"

	"github.com/espd/espd/sa"
)

// handle answers one decoded message. It returns an error only when the
// connection must close (a write failed).
func (c *conn) handle(m *Message) error {
	fail := func(err error) error {
		e, ok := err.(*Error)
		if !ok {
			e = &Error{Code: errnoFromError(err), Msg: err.Error(), Attr: attrFromError(err, m.Attrs)}
		}
		return c.sendError(m.Version, m.Seq, m.Type, e)
	}
	if m.Flags&FlagReply != 0 {
		return fail(Errorf(EPROTO, "%v with the reply flag: clients send requests only", m.Type))
	}
	if m.Type != MsgHello && !slices.Contains(SupportedVersions, m.Version) {
		return fail(versionError([]uint8{m.Version}))
	}
	h, ok := handlers[m.Type]
	if !ok {
		switch {
		case m.Type.Reserved():
			return fail(Errorf(EOPNOTSUPP, "%v: message type reserved for IKE packet hand-off, not implemented", m.Type))
		case m.Type == MsgError || m.Type == MsgDone || m.Type == MsgEvent:
			return fail(Errorf(EPROTO, "%v is sent by the server only", m.Type))
		}
		return fail(Errorf(EOPNOTSUPP, "unknown message type 0x%04x", uint16(m.Type)))
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
	m      *Message
	failed bool // a write failed: the connection is closing
	err    error
}

// reply sends the single reply, built by fill.
func (r *replier) reply(fill func(*Builder)) error {
	return r.send(r.m.Type, FlagReply, fill)
}

// part sends one part of a multi-part reply.
func (r *replier) part(fill func(*Builder)) error {
	return r.send(r.m.Type, FlagReply|FlagMulti, fill)
}

// done ends a multi-part reply.
func (r *replier) done() error { return r.send(MsgDone, FlagReply, nil) }

func (r *replier) send(t MsgType, f Flags, fill func(*Builder)) error {
	b := NewBuilder(r.m.Version, t, f, r.m.Seq)
	if fill != nil {
		fill(b)
	}
	msg, err := b.Bytes()
	if err != nil {
		return err
	}
	write := r.c.write
	if f&FlagMulti == 0 {
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
type handler func(c *conn, m *Message, r *replier) error

var handlers map[MsgType]handler

func init() {
	handlers = map[MsgType]handler{
		MsgHello:        handleHello,
		MsgSAAdd:        handleSAAdd,
		MsgSAUpdate:     handleSAUpdate,
		MsgSADel:        handleSADel,
		MsgSAGet:        handleSAGet,
		MsgSAList:       handleSAList,
		MsgSAFlush:      handleSAFlush,
		MsgSPIAlloc:     handleSPIAlloc,
		MsgPolicyAdd:    handlePolicyAdd,
		MsgPolicyUpdate: handlePolicyUpdate,
		MsgPolicyDel:    handlePolicyDel,
		MsgPolicyGet:    handlePolicyGet,
		MsgPolicyList:   handlePolicyList,
		MsgPolicyFlush:  handlePolicyFlush,
		MsgStats:        handleStats,
		MsgSubscribe:    handleSubscribe,
		MsgUnsubscribe:  handleUnsubscribe,
		// IKE hand-off (ike.go)
		MsgIKERegister:   handleIKERegister,
		MsgIKEPacket:     handleIKEPacket,
		MsgIKEUnregister: handleIKEUnregister,
	}
}

func handleHello(c *conn, m *Message, r *replier) error {
	offered, err := readHelloVersions(m)
	if err != nil {
		return err
	}
	v, ok := chooseVersion(offered)
	if !ok {
		return versionError(offered)
	}
	r.m.Version = v
	return r.reply(func(b *Builder) {
		putHelloReply(b, HelloInfo{Version: v, Software: Software, MaxMessageSize: MaxMessageSize})
	})
}

func handleSAAdd(c *conn, m *Message, r *replier) error {
	cfg, err := readSAAdd(m.Attrs)
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

func handleSAUpdate(c *conn, m *Message, r *replier) error {
	u, err := readSAUpdate(m.Attrs)
	defer zeroKeys(&u.Config)
	if err != nil {
		return err
	}
	cur, err := c.s.backend.GetSA(u.SPI, u.Dst)
	if err != nil {
		return err
	}
	if cur.Stats.State == sa.StateLarval {
		return Errorf(EINVAL, "spi 0x%08x is an SPI reservation, not a state: install it with SA_ADD", u.SPI)
	}
	if err := c.s.backend.UpdateSA(u.Apply(cur.Config)); err != nil {
		return err
	}
	return r.reply(nil)
}

func handleSADel(c *conn, m *Message, r *replier) error {
	rd := newReader(m.Attrs)
	spi, dst := readSAID(rd)
	if err := rd.error(); err != nil {
		return err
	}
	if err := c.s.backend.DeleteSA(spi, dst); err != nil {
		return err
	}
	return r.reply(nil)
}

func handleSAGet(c *conn, m *Message, r *replier) error {
	rd := newReader(m.Attrs)
	spi, dst := readSAID(rd)
	if err := rd.error(); err != nil {
		return err
	}
	in, err := c.s.backend.GetSA(spi, dst)
	if err != nil {
		return err
	}
	return r.reply(func(b *Builder) { putSAInfo(b, in) })
}

func handleSAList(c *conn, m *Message, r *replier) error {
	list, err := c.s.backend.ListSAs()
	if err != nil {
		return err
	}
	for _, in := range list {
		if err := r.part(func(b *Builder) { putSAInfo(b, in) }); err != nil {
			return err
		}
	}
	return r.done()
}

func handleSAFlush(c *conn, m *Message, r *replier) error {
	if err := c.s.backend.FlushSAs(); err != nil {
		return err
	}
	return r.reply(nil)
}

func handleSPIAlloc(c *conn, m *Message, r *replier) error {
	rd := newReader(m.Attrs)
	lo, ok := rd.u32(AttrSPIMin)
	if !ok {
		lo = DefaultSPIMin
	}
	hi, ok := rd.u32(AttrSPIMax)
	if !ok {
		hi = DefaultSPIMax
	}
	if err := rd.error(); err != nil {
		return err
	}
	if lo > hi {
		return &Error{Code: EINVAL, Msg: fmt.Sprintf("SPI range 0x%08x-0x%08x is empty", lo, hi), Attr: AttrSPIMin}
	}
	spi, err := c.s.backend.AllocSPI(lo, hi)
	if err != nil {
		return err
	}
	return r.reply(func(b *Builder) { b.U32(AttrSPI, spi) })
}

func handlePolicyAdd(c *conn, m *Message, r *replier) error {
	p, err := readPolicy(m.Attrs)
	if err != nil {
		return err
	}
	p, err = c.s.backend.AddPolicy(p)
	if err != nil {
		return err
	}
	return r.reply(func(b *Builder) { putPolicy(b, p) })
}

func handlePolicyUpdate(c *conn, m *Message, r *replier) error {
	p, err := readPolicy(m.Attrs)
	if err != nil {
		return err
	}
	p, err = c.s.backend.UpdatePolicy(p)
	if err != nil {
		return err
	}
	return r.reply(func(b *Builder) { putPolicy(b, p) })
}

func handlePolicyDel(c *conn, m *Message, r *replier) error {
	id, err := readPolicyID(m.Attrs)
	if err != nil {
		return err
	}
	if err := c.s.backend.DeletePolicy(id); err != nil {
		return err
	}
	return r.reply(nil)
}

func handlePolicyGet(c *conn, m *Message, r *replier) error {
	id, err := readPolicyID(m.Attrs)
	if err != nil {
		return err
	}
	p, err := c.s.backend.GetPolicy(id)
	if err != nil {
		return err
	}
	return r.reply(func(b *Builder) { putPolicy(b, p) })
}

func handlePolicyList(c *conn, m *Message, r *replier) error {
	list, err := c.s.backend.ListPolicies()
	if err != nil {
		return err
	}
	for _, p := range list {
		if err := r.part(func(b *Builder) { putPolicy(b, p) }); err != nil {
			return err
		}
	}
	return r.done()
}

func handlePolicyFlush(c *conn, m *Message, r *replier) error {
	if err := c.s.backend.FlushPolicies(); err != nil {
		return err
	}
	return r.reply(nil)
}

func handleStats(c *conn, m *Message, r *replier) error {
	rd := newReader(m.Attrs)
	spi, hasSPI := rd.u32(AttrSPI)
	dst, hasDst := rd.addr(AttrDst)
	if err := rd.error(); err != nil {
		return err
	}
	if hasSPI != hasDst {
		return &Error{Code: EINVAL, Msg: "STATS names one state with both SPI and DST, or none", Attr: AttrSPI}
	}
	g, err := c.s.backend.Stats()
	if err != nil {
		return err
	}
	var list []SAInfo
	if hasSPI {
		in, err := c.s.backend.GetSA(spi, dst)
		if err != nil {
			return err
		}
		list = []SAInfo{in}
	} else if list, err = c.s.backend.ListSAs(); err != nil {
		return err
	}
	if err := r.part(func(b *Builder) { putGlobalStats(b, g) }); err != nil {
		return err
	}
	for _, in := range list {
		if err := r.part(func(b *Builder) { putSAStatsPart(b, in) }); err != nil {
			return err
		}
	}
	return r.done()
}

// putSAStatsPart appends one per-state part of a STATS reply.
func putSAStatsPart(b *Builder, in SAInfo) {
	b.U32(AttrSPI, in.Config.SPI)
	b.Addr(AttrSrc, in.Config.Src)
	b.Addr(AttrDst, in.Config.Dst)
	b.U32(AttrDir, dirToWire[in.Config.Dir])
	b.U32(AttrReqID, in.Config.ReqID)
	if in.Config.IfID != 0 {
		b.U32(AttrIfID, in.Config.IfID)
	}
	putSAStats(b, in.Stats, in.ReplayTop, in.ReplayBitmap)
}

func handleSubscribe(c *conn, m *Message, r *replier) error {
	if c.sub != nil {
		return Errorf(EALREADY, "already subscribed")
	}
	rd := newReader(m.Attrs)
	mask := AllEvents
	if v, ok := rd.u32(AttrEventMask); ok {
		mask = EventMask(v)
	}
	if err := rd.error(); err != nil {
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

func handleUnsubscribe(c *conn, m *Message, r *replier) error {
	if c.sub == nil {
		return Errorf(ENOENT, "not subscribed")
	}
	c.unsubscribe()
	return r.reply(nil)
}
