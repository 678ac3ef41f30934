package main

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/espd/espd/control"
	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/sa"
)

// The --json output: stable names, numbers as numbers, times in RFC 3339,
// durations in seconds, keys only as a redacted marker.

type selectorJSON struct {
	Src   string `json:"src"`
	Dst   string `json:"dst"`
	Proto uint8  `json:"proto"`
	Sport string `json:"sport"`
	Dport string `json:"dport"`
}

func selectorView(s sa.Selector) selectorJSON {
	return selectorJSON{Src: prefixString(s.Src), Dst: prefixString(s.Dst), Proto: s.Proto,
		Sport: s.SrcPorts.String(), Dport: s.DstPorts.String()}
}

type lifetimeJSON struct {
	Bytes      uint64  `json:"bytes"`
	Packets    uint64  `json:"packets"`
	AddSeconds float64 `json:"add_seconds"`
	UseSeconds float64 `json:"use_seconds"`
}

func lifetimeView(l sa.Lifetime) lifetimeJSON {
	return lifetimeJSON{Bytes: l.Bytes, Packets: l.Packets, AddSeconds: l.AddTime.Seconds(), UseSeconds: l.UseTime.Seconds()}
}

func timeView(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format(time.RFC3339Nano)
	return &s
}

func dropsView(d *[sa.NumDropReasons]uint64) map[string]uint64 {
	m := make(map[string]uint64, sa.NumDropReasons)
	for r := range sa.NumDropReasons {
		m[r.String()] = d[r]
	}
	return m
}

type saJSON struct {
	SPI          uint32         `json:"spi"`
	SPIHex       string         `json:"spi_hex"`
	Dir          string         `json:"dir"`
	State        string         `json:"state"`
	Src          string         `json:"src"`
	Dst          string         `json:"dst"`
	Proto        string         `json:"proto"`
	Mode         string         `json:"mode"`
	ReqID        uint32         `json:"reqid"`
	IfID         uint32         `json:"if_id"`
	Alg          string         `json:"alg,omitempty"`
	EncAlg       uint16         `json:"enc_alg"`
	EncKeyBits   int            `json:"enc_key_bits"`
	IntegAlg     uint16         `json:"integ_alg"`
	ESN          bool           `json:"esn"`
	Keys         string         `json:"keys"`
	ReplayWindow uint32         `json:"replay_window"`
	EncapSport   uint16         `json:"encap_sport"`
	EncapDport   uint16         `json:"encap_dport"`
	Selectors    []selectorJSON `json:"selectors"`
	Soft         lifetimeJSON   `json:"soft"`
	Hard         lifetimeJSON   `json:"hard"`
	TTL          uint8          `json:"ttl"`
	DSCP         uint8          `json:"dscp"`
	CopyDSCP     bool           `json:"copy_dscp"`
	ECN          bool           `json:"ecn"`
	DF           string         `json:"df"`
	TFCPadTo     int            `json:"tfc"`
	// Negotiated: the keys were negotiated by an IKE daemon; false:
	// manual keying.
	Negotiated bool        `json:"negotiated"`
	Stats      saStatsJSON `json:"stats"`
}

type saStatsJSON struct {
	Packets   uint64  `json:"packets"`
	Bytes     uint64  `json:"bytes"`
	AddTime   *string `json:"add_time"`
	FirstUse  *string `json:"first_use"`
	SeqOut    uint64  `json:"seq_out"`
	ReplayTop uint64  `json:"replay_top"`
	// ReplayBitmap is the inbound window in --replay-bitmap's form: hex
	// bytes, bit i (byte i/8, value 1<<(i%8)) for replay_top minus i; ""
	// when there is none.
	ReplayBitmap string            `json:"replay_bitmap"`
	Drops        map[string]uint64 `json:"drops"`
}

func saStatsView(st sa.Stats, top uint64, bitmap []byte) saStatsJSON {
	v := saStatsJSON{Packets: st.Packets, Bytes: st.Bytes, AddTime: timeView(st.AddTime),
		FirstUse: timeView(st.FirstUse), SeqOut: st.SeqOut, ReplayTop: top, Drops: dropsView(&st.Drops)}
	if len(bitmap) > 0 {
		v.ReplayBitmap = fmt.Sprintf("0x%x", bitmap)
	}
	return v
}

func saView(in wire.SAInfo) saJSON {
	c := in.Config
	v := saJSON{
		SPI: c.SPI, SPIHex: fmt.Sprintf("0x%08x", c.SPI), Dir: c.Dir.String(), State: in.Stats.State.String(),
		Src: addrString(c.Src), Dst: addrString(c.Dst), Proto: "esp", Mode: c.Mode.String(), ReqID: c.ReqID, IfID: c.IfID,
		EncAlg: uint16(c.Suite.Encryption), EncKeyBits: c.Suite.KeyBits, IntegAlg: uint16(c.Suite.Integrity),
		ESN: c.Suite.ESN, Keys: redacted, ReplayWindow: c.ReplayWindow,
		EncapSport: c.EncapSrcPort, EncapDport: c.EncapDstPort, Selectors: []selectorJSON{},
		Soft: lifetimeView(c.Soft), Hard: lifetimeView(c.Hard), TTL: c.TTL, DSCP: c.DSCP,
		CopyDSCP: c.CopyDSCP, ECN: c.ECN, DF: c.DF.String(), TFCPadTo: c.TFCPadTo, Negotiated: c.Negotiated,
		Stats: saStatsView(in.Stats, in.ReplayTop, in.ReplayBitmap),
	}
	if c.Suite != (crypto.Suite{}) {
		v.Alg = c.Suite.String()
	}
	for _, s := range c.Selectors {
		v.Selectors = append(v.Selectors, selectorView(s))
	}
	return v
}

type policyJSON struct {
	selectorJSON
	Dir      string `json:"dir"`
	Action   string `json:"action"`
	Priority uint32 `json:"priority"`
	ReqID    uint32 `json:"reqid"`
	IfID     uint32 `json:"if_id"`
	Index    uint32 `json:"index"`
	TmplSrc  string `json:"tmpl_src"`
	TmplDst  string `json:"tmpl_dst"`
	Mode     string `json:"mode"`
}

func policyView(p sa.Policy) policyJSON {
	return policyJSON{selectorJSON: selectorView(p.Selector), Dir: p.Dir.String(), Action: p.Action.String(),
		Priority: p.Priority, ReqID: p.ReqID, IfID: p.IfID, Index: p.Index, TmplSrc: addrString(p.TmplSrc), TmplDst: addrString(p.TmplDst),
		Mode: p.Mode.String()}
}

func spiView(spi uint32) map[string]any {
	return map[string]any{"spi": spi, "spi_hex": fmt.Sprintf("0x%08x", spi)}
}

type statsJSON struct {
	Global globalJSON    `json:"global"`
	SAs    []saStatsLine `json:"sas"`
}

type globalJSON struct {
	States             int               `json:"states"`
	Larval             int               `json:"larval"`
	Policies           int               `json:"policies"`
	Packets            uint64            `json:"packets"`
	Bytes              uint64            `json:"bytes"`
	Drops              map[string]uint64 `json:"drops"`
	InvalidSPI         uint64            `json:"invalid_spi"`
	Malformed          uint64            `json:"malformed"`
	PolicyDrops        uint64            `json:"policy_drops"`
	NoState            uint64            `json:"no_state"`
	QueueDrops         uint64            `json:"queue_drops"`
	Acquires           uint64            `json:"acquires"`
	AcquiresSuppressed uint64            `json:"acquires_suppressed"`
	EventsDropped      uint64            `json:"events_dropped"`
}

type saStatsLine struct {
	SPI   uint32      `json:"spi"`
	Dst   string      `json:"dst"`
	Dir   string      `json:"dir"`
	ReqID uint32      `json:"reqid"`
	IfID  uint32      `json:"if_id"`
	State string      `json:"state"`
	Stats saStatsJSON `json:"stats"`
}

func statsView(st control.Stats) statsJSON {
	g := st.Global
	v := statsJSON{Global: globalJSON{States: g.States, Larval: g.Larval, Policies: g.Policies,
		Packets: g.Packets, Bytes: g.Bytes, Drops: dropsView(&g.Drops), InvalidSPI: g.InvalidSPI,
		Malformed: g.Malformed, PolicyDrops: g.PolicyDrops, NoState: g.NoState, QueueDrops: g.QueueDrops,
		Acquires: g.Acquires, AcquiresSuppressed: g.AcquiresSuppressed, EventsDropped: g.EventsDropped},
		SAs: []saStatsLine{}}
	for _, in := range st.SAs {
		v.SAs = append(v.SAs, saStatsLine{SPI: in.Config.SPI, Dst: addrString(in.Config.Dst), Dir: in.Config.Dir.String(),
			ReqID: in.Config.ReqID, IfID: in.Config.IfID, State: in.Stats.State.String(), Stats: saStatsView(in.Stats, in.ReplayTop, in.ReplayBitmap)})
	}
	return v
}

type eventJSON struct {
	Type    string      `json:"type"`
	Time    *string     `json:"time"`
	SPI     uint32      `json:"spi,omitempty"`
	Dst     string      `json:"dst,omitempty"`
	Dir     string      `json:"dir"`
	ReqID   uint32      `json:"reqid"`
	Reason  string      `json:"reason,omitempty"`
	Policy  *policyJSON `json:"policy,omitempty"`
	Flow    *flowJSON   `json:"flow,omitempty"`
	NewAddr string      `json:"new_addr,omitempty"`
	Lost    uint64      `json:"lost"`
}

type flowJSON struct {
	Src   string `json:"src"`
	Dst   string `json:"dst"`
	Proto uint8  `json:"proto"`
	Sport uint16 `json:"sport"`
	Dport uint16 `json:"dport"`
}

func eventView(e wire.Event) eventJSON {
	v := eventJSON{Type: e.Kind.String(), Time: timeView(e.Time), SPI: e.SPI, Dir: e.Dir.String(), ReqID: e.ReqID, Lost: e.Lost}
	if e.Dst.IsValid() {
		v.Dst = e.Dst.String()
	}
	switch e.Kind {
	case wire.EventSoftExpire, wire.EventHardExpire:
		v.Reason = e.Reason.String()
	case wire.EventAcquire:
		p := policyView(e.Policy)
		v.Policy = &p
		v.Flow = &flowJSON{Src: addrString(e.Flow.Src), Dst: addrString(e.Flow.Dst), Proto: e.Flow.Proto,
			Sport: e.Flow.SrcPort, Dport: e.Flow.DstPort}
	case wire.EventMapping:
		v.NewAddr = e.NewAddr.String()
	}
	return v
}

type pairJSON struct {
	Node     uint32 `json:"node"`
	Role     string `json:"role"`
	Released uint32 `json:"released"`
	Silent   uint32 `json:"silent"`
	// PeerHeardMs is null when the other node was never heard.
	PeerHeardMs *uint64 `json:"peer_heard_ms"`
}

func pairView(st wire.PairStatus) pairJSON {
	v := pairJSON{Node: st.Node, Role: st.Role.String(), Released: st.Released, Silent: st.Silent}
	if st.PeerHeardMs != 0 {
		v.PeerHeardMs = &st.PeerHeardMs
	}
	return v
}

// writeJSON writes v as one line of JSON.
func writeJSON(w io.Writer, v any) error {
	return json.NewEncoder(w).Encode(v)
}
