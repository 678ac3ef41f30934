package control

import (
	"context"
	"errors"
	"net/netip"

	"github.com/espd/espd/sa"
)

// Hello negotiates the protocol version; Dial already did.
func (c *Client) Hello(ctx context.Context) (HelloInfo, error) {
	attrs, err := single(c.do(ctx, MsgHello, func(b *Builder) {
		for _, v := range SupportedVersions {
			b.U32(AttrVersion, uint32(v))
		}
	}))
	if err != nil {
		return HelloInfo{}, err
	}
	return readHelloReply(attrs)
}

// AddSA installs a state (SA_ADD). Every field of cfg is sent, so every
// field is explicit: build cfg from sa.DefaultConfig() to get espd's
// defaults (a zero ReplayWindow, for one, turns anti-replay off), or use
// AddSAFields to send only what the caller was told.
func (c *Client) AddSA(ctx context.Context, cfg sa.Config) error {
	_, err := c.do(ctx, MsgSAAdd, func(b *Builder) { putSAConfig(b, cfg, true) })
	return err
}

// AddSAFields installs a state (SA_ADD) from cfg.SPI and the fields f of
// cfg; the server gives every other field its default (sa.DefaultConfig),
// as it does for any attribute a client leaves out. The state's source,
// destination, direction and suite must be among f (FieldKeys too, unless
// the suite takes no keys).
func (c *Client) AddSAFields(ctx context.Context, cfg sa.Config, f Fields) error {
	_, err := c.do(ctx, MsgSAAdd, func(b *Builder) {
		b.U32(AttrSPI, cfg.SPI)
		b.U32(AttrProto, ProtoESP)
		b.U32(AttrMode, ModeTunnel)
		putSAFields(b, cfg, f, false)
	})
	return err
}

// UpdateSA changes a state (SA_UPDATE): the fields u.Fields of u.Config
// replace those of the state with u.SPI and u.Dst.
func (c *Client) UpdateSA(ctx context.Context, u SAUpdate) error {
	_, err := c.do(ctx, MsgSAUpdate, func(b *Builder) {
		b.U32(AttrSPI, u.SPI)
		b.Addr(AttrDst, u.Dst)
		putSAFields(b, u.Config, u.Fields, true)
	})
	return err
}

// DeleteSA removes a state or SPI reservation (SA_DEL).
func (c *Client) DeleteSA(ctx context.Context, spi uint32, dst netip.Addr) error {
	_, err := c.do(ctx, MsgSADel, func(b *Builder) {
		b.U32(AttrSPI, spi)
		b.Addr(AttrDst, dst)
	})
	return err
}

// GetSA returns a state's configuration (without keys) and counters
// (SA_GET).
func (c *Client) GetSA(ctx context.Context, spi uint32, dst netip.Addr) (SAInfo, error) {
	attrs, err := single(c.do(ctx, MsgSAGet, func(b *Builder) {
		b.U32(AttrSPI, spi)
		b.Addr(AttrDst, dst)
	}))
	if err != nil {
		return SAInfo{}, err
	}
	return readSAInfo(attrs)
}

// ListSAs returns every state and SPI reservation (SA_LIST).
func (c *Client) ListSAs(ctx context.Context) ([]SAInfo, error) {
	parts, err := c.do(ctx, MsgSAList, nil)
	if err != nil {
		return nil, err
	}
	out := make([]SAInfo, 0, len(parts))
	for _, m := range parts {
		in, err := readSAInfo(m.Attrs)
		if err != nil {
			return nil, err
		}
		out = append(out, in)
	}
	return out, nil
}

// FlushSAs removes every state (SA_FLUSH).
func (c *Client) FlushSAs(ctx context.Context) error {
	_, err := c.do(ctx, MsgSAFlush, nil)
	return err
}

// AllocSPI reserves an unused inbound SPI in [lo, hi] (SPI_ALLOC); lo and
// hi both 0 mean the default range.
func (c *Client) AllocSPI(ctx context.Context, lo, hi uint32) (uint32, error) {
	attrs, err := single(c.do(ctx, MsgSPIAlloc, func(b *Builder) {
		if lo != 0 || hi != 0 {
			b.U32(AttrSPIMin, lo)
			b.U32(AttrSPIMax, hi)
		}
	}))
	if err != nil {
		return 0, err
	}
	r := newReader(attrs)
	spi, ok := r.u32(AttrSPI)
	r.require(AttrSPI, ok)
	return spi, r.error()
}

// AddPolicy installs a policy and returns it with its index (POLICY_ADD).
func (c *Client) AddPolicy(ctx context.Context, p sa.Policy) (sa.Policy, error) {
	return c.policyReply(c.do(ctx, MsgPolicyAdd, func(b *Builder) { p.Index = 0; putPolicy(b, p) }))
}

// UpdatePolicy replaces the policy with p's selector and direction
// (POLICY_UPDATE).
func (c *Client) UpdatePolicy(ctx context.Context, p sa.Policy) (sa.Policy, error) {
	return c.policyReply(c.do(ctx, MsgPolicyUpdate, func(b *Builder) { p.Index = 0; putPolicy(b, p) }))
}

// GetPolicy returns the policy id names (POLICY_GET).
func (c *Client) GetPolicy(ctx context.Context, id sa.PolicyID) (sa.Policy, error) {
	return c.policyReply(c.do(ctx, MsgPolicyGet, func(b *Builder) { putPolicyID(b, id) }))
}

func (c *Client) policyReply(parts []*Message, err error) (sa.Policy, error) {
	attrs, err := single(parts, err)
	if err != nil {
		return sa.Policy{}, err
	}
	return readPolicy(attrs)
}

// DeletePolicy removes the policy id names (POLICY_DEL).
func (c *Client) DeletePolicy(ctx context.Context, id sa.PolicyID) error {
	_, err := c.do(ctx, MsgPolicyDel, func(b *Builder) { putPolicyID(b, id) })
	return err
}

// ListPolicies returns every policy (POLICY_LIST).
func (c *Client) ListPolicies(ctx context.Context) ([]sa.Policy, error) {
	parts, err := c.do(ctx, MsgPolicyList, nil)
	if err != nil {
		return nil, err
	}
	out := make([]sa.Policy, 0, len(parts))
	for _, m := range parts {
		p, err := readPolicy(m.Attrs)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// FlushPolicies removes every policy (POLICY_FLUSH).
func (c *Client) FlushPolicies(ctx context.Context) error {
	_, err := c.do(ctx, MsgPolicyFlush, nil)
	return err
}

// Stats is the STATS reply: the global counters and each state's.
type Stats struct {
	Global GlobalStats
	// SAs holds one entry per state; of their Config only SPI, Src, Dst,
	// Dir and ReqID are filled in.
	SAs []SAInfo
}

// Stats returns the global counters and those of every state (STATS).
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	return c.stats(ctx, nil)
}

// SAStats returns the global counters and those of one state (STATS).
func (c *Client) SAStats(ctx context.Context, spi uint32, dst netip.Addr) (Stats, error) {
	return c.stats(ctx, func(b *Builder) {
		b.U32(AttrSPI, spi)
		b.Addr(AttrDst, dst)
	})
}

func (c *Client) stats(ctx context.Context, fill func(*Builder)) (Stats, error) {
	parts, err := c.do(ctx, MsgStats, fill)
	if err != nil {
		return Stats{}, err
	}
	var st Stats
	for i, m := range parts {
		r := newReader(m.Attrs)
		if i == 0 {
			n, ok := r.nest(AttrGlobalStats, spaceGlobalStats)
			r.require(AttrGlobalStats, ok)
			if ok {
				st.Global = readGlobalStats(n)
				r.absorb(n)
			}
			if err := r.error(); err != nil {
				return Stats{}, err
			}
			continue
		}
		var in SAInfo
		var ok bool
		in.Config.SPI, ok = r.u32(AttrSPI)
		r.require(AttrSPI, ok)
		in.Config.Dst, _ = r.addr(AttrDst) // none for an SPI reservation
		in.Config.Src, _ = r.addr(AttrSrc)
		if v, ok := r.u32(AttrDir); ok {
			in.Config.Dir, _ = dirFromWire(v)
		}
		in.Config.ReqID, _ = r.u32(AttrReqID)
		in.Config.IfID, _ = r.u32(AttrIfID)
		if n, ok := r.nest(AttrSAStats, spaceSAStats); ok {
			in.Stats, in.ReplayTop, in.ReplayBitmap = readSAStats(n)
			r.absorb(n)
		}
		if err := r.error(); err != nil {
			return Stats{}, err
		}
		st.SAs = append(st.SAs, in)
	}
	if len(parts) == 0 {
		return Stats{}, errors.New("control: empty STATS reply")
	}
	return st, nil
}

// Subscribe asks for EVENT messages of the kinds given (all if none) and
// returns the channel they arrive on. The channel closes when the
// connection does. A reader that falls behind loses events; each event's
// Lost counts those lost before it, here or in the server.
func (c *Client) Subscribe(ctx context.Context, kinds ...EventKind) (<-chan Event, error) {
	c.mu.Lock()
	if c.events != nil {
		c.mu.Unlock()
		return nil, Errorf(EALREADY, "already subscribed")
	}
	ch := make(chan Event, clientEventBuffer)
	c.events = ch
	c.mu.Unlock()
	mask := MaskOf(kinds...)
	if _, err := c.do(ctx, MsgSubscribe, func(b *Builder) { b.U32(AttrEventMask, uint32(mask)) }); err != nil {
		c.mu.Lock()
		if c.err == nil { // the channel stays ours to drop
			c.events = nil
		}
		c.mu.Unlock()
		return nil, err
	}
	return ch, nil
}
