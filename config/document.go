package config

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/sa"
)

// document is the TOML layout of the file.
type document struct {
	SA        []saEntry        `toml:"sa"`
	Policy    []policyEntry    `toml:"policy"`
	Interface []interfaceEntry `toml:"interface"`
}

// saEntry is one [[sa]] table.
type saEntry struct {
	SPI          uint32          `toml:"spi"`
	Dir          string          `toml:"dir"`
	Src          string          `toml:"src"`
	Dst          string          `toml:"dst"`
	Mode         string          `toml:"mode"`
	Proto        string          `toml:"proto"`
	Suite        string          `toml:"suite"`
	EncKey       string          `toml:"enc_key"`
	IntegKey     string          `toml:"integ_key"`
	EncKeyFile   string          `toml:"enc_key_file"`
	IntegKeyFile string          `toml:"integ_key_file"`
	ReplayWindow *uint32         `toml:"replay_window"`
	ESN          bool            `toml:"esn"`
	Encap        *encapEntry     `toml:"encap"`
	ReqID        uint32          `toml:"reqid"`
	IfID         uint32          `toml:"if_id"`
	Selectors    []selectorEntry `toml:"selector"`
	Soft         lifetimeEntry   `toml:"soft"`
	Hard         lifetimeEntry   `toml:"hard"`
	TTL          uint8           `toml:"ttl"`
	DSCP         string          `toml:"dscp"`
	ECN          *bool           `toml:"ecn"`
	DF           string          `toml:"df"`
	TFCPadTo     int             `toml:"tfc_pad_to"`
	OSeq         seqNumber       `toml:"oseq"`
	ReplaySeq    seqNumber       `toml:"replay_seq"`
	ReplayBitmap string          `toml:"replay_bitmap"`
}

// seqNumber is a 64-bit sequence number in the file: a TOML integer, or
// a string (decimal or 0x hex) for the values a TOML integer cannot hold
// (2^63 and above).
type seqNumber struct {
	v   uint64
	err error
}

// UnmarshalTOML takes an integer or a string; a bad value is reported by
// saEntry.config, with the SA's line.
func (n *seqNumber) UnmarshalTOML(v any) error {
	switch x := v.(type) {
	case int64:
		if x < 0 {
			n.err = fmt.Errorf("%d is negative", x)
		}
		n.v = uint64(x)
	case string:
		n.v, n.err = ParseSeq("value", x)
	default:
		n.err = fmt.Errorf("want an integer or a string, not %T", v)
	}
	return nil
}

// encapEntry is the encap table of an SA: ESP-in-UDP ports.
type encapEntry struct {
	SrcPort uint16 `toml:"src_port"`
	DstPort uint16 `toml:"dst_port"`
}

// selectorEntry is a traffic selector, of an SA or a policy.
type selectorEntry struct {
	Src      string `toml:"src"`
	Dst      string `toml:"dst"`
	Proto    string `toml:"proto"`
	SrcPorts string `toml:"src_ports"`
	DstPorts string `toml:"dst_ports"`
}

// lifetimeEntry is a soft or hard lifetime.
type lifetimeEntry struct {
	Bytes   string `toml:"bytes"`
	Packets uint64 `toml:"packets"`
	AddTime string `toml:"add_time"`
	UseTime string `toml:"use_time"`
}

// policyEntry is one [[policy]] table.
type policyEntry struct {
	selectorEntry
	Dir      string `toml:"dir"`
	Action   string `toml:"action"`
	Priority uint32 `toml:"priority"`
	ReqID    uint32 `toml:"reqid"`
	IfID     uint32 `toml:"if_id"`
	TmplSrc  string `toml:"tmpl_src"`
	TmplDst  string `toml:"tmpl_dst"`
	Mode     string `toml:"mode"`
}

// interfaceEntry is one [[interface]] table. IfID is a pointer to tell a
// missing if_id from if_id = 0.
type interfaceEntry struct {
	Name string  `toml:"name"`
	IfID *uint32 `toml:"if_id"`
	MTU  int     `toml:"mtu"`
}

// config converts and validates an [[sa]] table; dir is the directory
// that relative key file names start from. On an error the Config it
// returns may hold keys, for the caller to zero. What the table does not set
// takes sa.DefaultConfig's value, and sa.Config.Validate has the last word,
// so that a state from the file is the state the control socket and espctl
// install from the same values.
func (e *saEntry) config(dir string) (sa.Config, error) {
	c := sa.DefaultConfig()
	var err error
	c.SPI = e.SPI
	if e.Dir == "" {
		return c, fmt.Errorf("dir is required (in or out)")
	}
	if c.Dir, err = sa.ParseDirection(e.Dir); err != nil {
		return c, err
	}
	if c.Dir == sa.DirFwd {
		return c, fmt.Errorf("dir fwd is for policies; an SA is in or out")
	}
	if e.Mode != "" {
		if c.Mode, err = ParseMode(e.Mode); err != nil {
			return c, err
		}
	}
	if e.Proto != "" && e.Proto != "esp" {
		return c, fmt.Errorf("proto %q is not supported (espd does esp)", e.Proto)
	}
	if c.Src, err = ParseAddr("src", e.Src); err != nil {
		return c, err
	}
	if c.Dst, err = ParseAddr("dst", e.Dst); err != nil {
		return c, err
	}
	if c.Src.Is4() != c.Dst.Is4() {
		return c, fmt.Errorf("src %s and dst %s are of different address families", c.Src, c.Dst)
	}
	if e.Suite == "" {
		return c, fmt.Errorf("suite is required (e.g. aes128gcm16, chacha20poly1305, aes256-sha256)")
	}
	if c.Suite, err = crypto.ParseSuite(e.Suite); err != nil {
		return c, err
	}
	if e.ESN {
		c.Suite.ESN = true
	}
	if c.EncKey, err = entryKey("enc_key", e.EncKey, e.EncKeyFile, dir, c.Suite.EncKeyLen()); err != nil {
		return c, err
	}
	if c.IntegKey, err = entryKey("integ_key", e.IntegKey, e.IntegKeyFile, dir, c.Suite.IntegKeyLen()); err != nil {
		clear(c.EncKey)
		return c, err
	}
	if e.ReplayWindow != nil {
		c.ReplayWindow = *e.ReplayWindow
	}
	if e.Encap != nil {
		if e.Encap.SrcPort == 0 || e.Encap.DstPort == 0 {
			return c, fmt.Errorf("encap needs both src_port and dst_port (4500 for NAT-T)")
		}
		c.EncapSrcPort, c.EncapDstPort = e.Encap.SrcPort, e.Encap.DstPort
	}
	c.ReqID = e.ReqID
	c.IfID = e.IfID
	for i := range e.Selectors {
		s, err := e.Selectors[i].selector()
		if err != nil {
			return c, fmt.Errorf("selector #%d: %v", i+1, err)
		}
		c.Selectors = append(c.Selectors, s)
	}
	if c.Soft, err = e.Soft.lifetime("soft"); err != nil {
		return c, err
	}
	if c.Hard, err = e.Hard.lifetime("hard"); err != nil {
		return c, err
	}
	c.TTL = e.TTL
	if e.DSCP != "" {
		if c.CopyDSCP, c.DSCP, err = ParseDSCP(e.DSCP); err != nil {
			return c, err
		}
	}
	if e.ECN != nil {
		c.ECN = *e.ECN
	}
	if e.DF != "" {
		if c.DF, err = ParseDF(e.DF); err != nil {
			return c, err
		}
	}
	if e.TFCPadTo < 0 || e.TFCPadTo > 65535 {
		return c, fmt.Errorf("tfc_pad_to %d is out of range 0-65535", e.TFCPadTo)
	}
	c.TFCPadTo = e.TFCPadTo
	for _, s := range []struct {
		key string
		n   seqNumber
		dst *uint64
	}{{"oseq", e.OSeq, &c.OSeq}, {"replay_seq", e.ReplaySeq, &c.ReplaySeq}} {
		if s.n.err != nil {
			return c, fmt.Errorf("%s: %v", s.key, s.n.err)
		}
		*s.dst = s.n.v
	}
	if e.ReplayBitmap != "" {
		if c.ReplayBitmap, err = ParseHexBytes("replay_bitmap", e.ReplayBitmap); err != nil {
			return c, err
		}
	}
	if err := c.Validate(); err != nil {
		var fe *sa.FieldError
		if errors.As(err, &fe) {
			// Name the file's key (replay_seq) before the message, which
			// uses XFRM's word (replay-seq).
			return c, fmt.Errorf("%s: %s", strings.ReplaceAll(fe.Field, "-", "_"), strings.TrimPrefix(err.Error(), "sa: "))
		}
		return c, errors.New(strings.TrimPrefix(err.Error(), "sa: "))
	}
	return c, nil
}

// entryKey returns an SA's key from its inline hex (key) or from its key
// file (file, relative to dir); name is the inline key's name.
func entryKey(name, key, file, dir string, want int) ([]byte, error) {
	switch {
	case key != "" && file != "":
		return nil, fmt.Errorf("%s and %s_file are both given; use one", name, name)
	case file != "":
		if !filepath.IsAbs(file) {
			file = filepath.Join(dir, file)
		}
		return ReadKeyFile(name+"_file", file, want)
	}
	return ParseKey(name, key, want)
}

// selector converts a selector table.
func (e *selectorEntry) selector() (sa.Selector, error) {
	var s sa.Selector
	var err error
	if s.Src, err = ParsePrefix("src", e.Src); err != nil {
		return s, err
	}
	if s.Dst, err = ParsePrefix("dst", e.Dst); err != nil {
		return s, err
	}
	if s.Src.Addr().Is4() != s.Dst.Addr().Is4() {
		return s, fmt.Errorf("src %s and dst %s are of different address families", s.Src, s.Dst)
	}
	if s.Proto, err = ParseProto(e.Proto); err != nil {
		return s, err
	}
	if s.SrcPorts, err = ParsePortRange("src_ports", e.SrcPorts); err != nil {
		return s, err
	}
	if s.DstPorts, err = ParsePortRange("dst_ports", e.DstPorts); err != nil {
		return s, err
	}
	if err := s.Validate(); err != nil {
		return s, err
	}
	return s, nil
}

// lifetime converts a soft or hard lifetime table.
func (e *lifetimeEntry) lifetime(which string) (sa.Lifetime, error) {
	var l sa.Lifetime
	var err error
	if l.Bytes, err = ParseBytes(which+".bytes", e.Bytes); err != nil {
		return l, err
	}
	l.Packets = e.Packets
	if l.AddTime, err = ParseDuration(which+".add_time", e.AddTime); err != nil {
		return l, err
	}
	if l.UseTime, err = ParseDuration(which+".use_time", e.UseTime); err != nil {
		return l, err
	}
	return l, nil
}

// policy converts and validates a [[policy]] table.
func (e *policyEntry) policy() (sa.Policy, error) {
	var p sa.Policy
	var err error
	if p.Selector, err = e.selectorEntry.selector(); err != nil {
		return p, err
	}
	if e.Dir == "" {
		return p, fmt.Errorf("dir is required (in, out or fwd)")
	}
	if p.Dir, err = sa.ParseDirection(e.Dir); err != nil {
		return p, err
	}
	p.Action = sa.ActionProtect
	if e.Action != "" {
		if p.Action, err = sa.ParseAction(e.Action); err != nil {
			return p, err
		}
	}
	p.Priority = e.Priority
	p.ReqID = e.ReqID
	p.IfID = e.IfID
	if e.Mode != "" {
		if p.Mode, err = ParseMode(e.Mode); err != nil {
			return p, err
		}
	}
	if p.Action == sa.ActionProtect && p.ReqID == 0 {
		return p, fmt.Errorf("a protect policy needs a reqid that ties it to its SAs")
	}
	if e.TmplSrc != "" || e.TmplDst != "" {
		if p.TmplSrc, err = ParseAddr("tmpl_src", e.TmplSrc); err != nil {
			return p, err
		}
		if p.TmplDst, err = ParseAddr("tmpl_dst", e.TmplDst); err != nil {
			return p, err
		}
	}
	return p, nil
}

// iface converts and validates an [[interface]] table.
func (e *interfaceEntry) iface() (Interface, error) {
	var ifc Interface
	if err := CheckInterfaceName(e.Name); err != nil {
		return ifc, err
	}
	ifc.Name = e.Name
	switch {
	case e.IfID == nil:
		return ifc, fmt.Errorf("if_id is required (1 to 4294967295): the interface ID that its SAs and policies name")
	case *e.IfID == 0:
		return ifc, fmt.Errorf("if_id 0 is espd's own policy-based TUN; a route-based interface takes 1 to 4294967295")
	}
	ifc.IfID = *e.IfID
	if e.MTU != 0 && (e.MTU < MinInterfaceMTU || e.MTU > MaxInterfaceMTU) {
		return ifc, fmt.Errorf("mtu %d is out of range %d-%d (0 or none: the default)", e.MTU, MinInterfaceMTU, MaxInterfaceMTU)
	}
	ifc.MTU = e.MTU
	return ifc, nil
}
