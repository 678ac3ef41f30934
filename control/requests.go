package control

import (
	"context"
	"errors"
	"net/netip"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/sa"
)

// Hello negotiates the protocol version; Dial already did.
func (c *Client) Hello(ctx context.Context) (wire.HelloInfo, error) {
	attrs, err := single(c.do(ctx, wire.MsgHello, func(b *wire.Builder) { wire.PutHello(b, wire.SupportedVersions) }))
	if err != nil {
		return wire.HelloInfo{}, err
	}
	return wire.ReadHelloReply(attrs)
}

// AddSA installs a state (SA_ADD). Every field of cfg is sent, so every
// field is explicit: build cfg from sa.DefaultConfig() to get espd's
// defaults (a zero ReplayWindow, for one, turns anti-replay off), or use
// AddSAFields to send only what the caller was told.
func (c *Client) AddSA(ctx context.Context, cfg sa.Config) error {
	_, err := c.do(ctx, wire.MsgSAAdd, func(b *wire.Builder) { wire.PutSAAdd(b, cfg) })
	return err
}

// AddSAFields installs a state (SA_ADD) from cfg.SPI and the fields f of
// cfg; the server gives every other field its default (sa.DefaultConfig),
// as it does for any attribute a client leaves out. The state's source,
// destination, direction and suite must be among f (FieldKeys too, unless
// the suite takes no keys).
func (c *Client) AddSAFields(ctx context.Context, cfg sa.Config, f wire.Fields) error {
	_, err := c.do(ctx, wire.MsgSAAdd, func(b *wire.Builder) { wire.PutSAAddFields(b, cfg, f) })
	return err
}

// UpdateSA changes a state (SA_UPDATE): the fields u.Fields of u.Config
// replace those of the state with u.SPI and u.Dst.
func (c *Client) UpdateSA(ctx context.Context, u wire.SAUpdate) error {
	_, err := c.do(ctx, wire.MsgSAUpdate, func(b *wire.Builder) { wire.PutSAUpdate(b, u) })
	return err
}

// DeleteSA removes a state or SPI reservation (SA_DEL).
func (c *Client) DeleteSA(ctx context.Context, spi uint32, dst netip.Addr) error {
	_, err := c.do(ctx, wire.MsgSADel, func(b *wire.Builder) { wire.PutSAID(b, spi, dst) })
	return err
}

// GetSA returns a state's configuration (without keys) and counters
// (SA_GET).
func (c *Client) GetSA(ctx context.Context, spi uint32, dst netip.Addr) (wire.SAInfo, error) {
	attrs, err := single(c.do(ctx, wire.MsgSAGet, func(b *wire.Builder) { wire.PutSAID(b, spi, dst) }))
	if err != nil {
		return wire.SAInfo{}, err
	}
	return wire.ReadSAInfo(attrs)
}

// ListSAs returns every state and SPI reservation (SA_LIST).
func (c *Client) ListSAs(ctx context.Context) ([]wire.SAInfo, error) {
	parts, err := c.do(ctx, wire.MsgSAList, nil)
	if err != nil {
		return nil, err
	}
	out := make([]wire.SAInfo, 0, len(parts))
	for _, m := range parts {
		in, err := wire.ReadSAInfo(m.Attrs)
		if err != nil {
			return nil, err
		}
		out = append(out, in)
	}
	return out, nil
}

// FlushSAs removes every state (SA_FLUSH).
func (c *Client) FlushSAs(ctx context.Context) error {
	_, err := c.do(ctx, wire.MsgSAFlush, nil)
	return err
}

// AllocSPI reserves an unused inbound SPI in [lo, hi] (SPI_ALLOC); lo and
// hi both 0 mean the default range.
func (c *Client) AllocSPI(ctx context.Context, lo, hi uint32) (uint32, error) {
	attrs, err := single(c.do(ctx, wire.MsgSPIAlloc, func(b *wire.Builder) {
		if lo != 0 || hi != 0 {
			wire.PutSPIRange(b, lo, hi)
		}
	}))
	if err != nil {
		return 0, err
	}
	return wire.ReadSPI(attrs)
}

// AddPolicy installs a policy and returns it with its index (POLICY_ADD).
func (c *Client) AddPolicy(ctx context.Context, p sa.Policy) (sa.Policy, error) {
	return c.policyReply(c.do(ctx, wire.MsgPolicyAdd, func(b *wire.Builder) { p.Index = 0; wire.PutPolicy(b, p) }))
}

// UpdatePolicy replaces the policy with p's selector and direction
// (POLICY_UPDATE).
func (c *Client) UpdatePolicy(ctx context.Context, p sa.Policy) (sa.Policy, error) {
	return c.policyReply(c.do(ctx, wire.MsgPolicyUpdate, func(b *wire.Builder) { p.Index = 0; wire.PutPolicy(b, p) }))
}

// GetPolicy returns the policy id names (POLICY_GET).
func (c *Client) GetPolicy(ctx context.Context, id sa.PolicyID) (sa.Policy, error) {
	return c.policyReply(c.do(ctx, wire.MsgPolicyGet, func(b *wire.Builder) { wire.PutPolicyID(b, id) }))
}

func (c *Client) policyReply(parts []*wire.Message, err error) (sa.Policy, error) {
	attrs, err := single(parts, err)
	if err != nil {
		return sa.Policy{}, err
	}
	return wire.ReadPolicy(attrs)
}

// DeletePolicy removes the policy id names (POLICY_DEL).
func (c *Client) DeletePolicy(ctx context.Context, id sa.PolicyID) error {
	_, err := c.do(ctx, wire.MsgPolicyDel, func(b *wire.Builder) { wire.PutPolicyID(b, id) })
	return err
}

// ListPolicies returns every policy (POLICY_LIST).
func (c *Client) ListPolicies(ctx context.Context) ([]sa.Policy, error) {
	parts, err := c.do(ctx, wire.MsgPolicyList, nil)
	if err != nil {
		return nil, err
	}
	out := make([]sa.Policy, 0, len(parts))
	for _, m := range parts {
		p, err := wire.ReadPolicy(m.Attrs)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// FlushPolicies removes every policy (POLICY_FLUSH).
func (c *Client) FlushPolicies(ctx context.Context) error {
	_, err := c.do(ctx, wire.MsgPolicyFlush, nil)
	return err
}

// Stats is the STATS reply: the global counters and each state's.
type Stats struct {
	Global wire.GlobalStats
	// SAs holds one entry per state; of their Config only SPI, Src, Dst,
	// Dir and ReqID are filled in.
	SAs []wire.SAInfo
}

// Stats returns the global counters and those of every state (STATS).
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	return c.stats(ctx, nil)
}

// SAStats returns the global counters and those of one state (STATS).
func (c *Client) SAStats(ctx context.Context, spi uint32, dst netip.Addr) (Stats, error) {
	return c.stats(ctx, func(b *wire.Builder) { wire.PutSAID(b, spi, dst) })
}

func (c *Client) stats(ctx context.Context, fill func(*wire.Builder)) (Stats, error) {
	parts, err := c.do(ctx, wire.MsgStats, fill)
	if err != nil {
		return Stats{}, err
	}
	var st Stats
	for i, m := range parts {
		if i == 0 {
			if st.Global, err = wire.ReadGlobalStats(m.Attrs); err != nil {
				return Stats{}, err
			}
			continue
		}
		in, err := wire.ReadSAStats(m.Attrs)
		if err != nil {
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
func (c *Client) Subscribe(ctx context.Context, kinds ...wire.EventKind) (<-chan wire.Event, error) {
	c.mu.Lock()
	if c.events != nil {
		c.mu.Unlock()
		return nil, wire.Errorf(wire.EALREADY, "already subscribed")
	}
	ch := make(chan wire.Event, clientEventBuffer)
	c.events = ch
	c.mu.Unlock()
	mask := wire.MaskOf(kinds...)
	if _, err := c.do(ctx, wire.MsgSubscribe, func(b *wire.Builder) { wire.PutSubscribe(b, mask) }); err != nil {
		c.mu.Lock()
		if c.err == nil { // the channel stays ours to drop
			c.events = nil
		}
		c.mu.Unlock()
		return nil, err
	}
	return ch, nil
}

// PairRole sets this espd's role in its gateway pair (PAIR_ROLE) when
// role is not wire.PairRoleNone, and returns the pair's status after;
// PairRoleNone only reads it. An espd not in a pair answers EOPNOTSUPP.
func (c *Client) PairRole(ctx context.Context, role wire.PairRole) (wire.PairStatus, error) {
	attrs, err := single(c.do(ctx, wire.MsgPairRole, func(b *wire.Builder) { wire.PutPairRole(b, role) }))
	if err != nil {
		return wire.PairStatus{}, err
	}
	return wire.ReadPairStatus(attrs)
}
