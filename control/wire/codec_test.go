package wire

import (
	"bytes"
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/sa"
)

func TestSAAddRoundTrip(t *testing.T) {
	for _, cfg := range []sa.Config{fullConfig(t), gcmConfig(t, 0x42)} {
		m := decodeOK(t, encode(t, MsgSAAdd, 0, 1, func(b *Builder) { putSAConfig(b, cfg, true) }))
		got, err := ReadSAAdd(m.Attrs)
		if err != nil {
			t.Fatal(err)
		}
		if !sameConfig(got, cfg) {
			t.Fatalf("round trip:\n got %v\nwant %v", got, cfg)
		}
	}
}

func TestSAUpdateRoundTrip(t *testing.T) {
	cfg := fullConfig(t)
	for _, f := range []Fields{0, FieldDst | FieldEncap, FieldSelectors | FieldSoft | FieldTTL, FieldsAll &^ FieldKeys, FieldsAll} {
		u := SAUpdate{SPI: cfg.SPI, Dst: v4a, Config: cfg, Fields: f}
		m := decodeOK(t, encode(t, MsgSAUpdate, 0, 1, func(b *Builder) {
			b.U32(AttrSPI, u.SPI)
			b.Addr(AttrDst, u.Dst)
			putSAFields(b, u.Config, u.Fields, true)
		}))
		got, err := ReadSAUpdate(m.Attrs)
		if err != nil {
			t.Fatal(err)
		}
		if got.SPI != u.SPI || got.Dst != u.Dst || got.Fields != f {
			t.Fatalf("fields %b: got spi %x dst %v fields %b", f, got.SPI, got.Dst, got.Fields)
		}
		base := gcmConfig(t, cfg.SPI)
		if a, b := got.Apply(base), u.Apply(base); !sameConfig(a, b) {
			t.Fatalf("fields %b: applied\n got %v\nwant %v", f, a, b)
		}
	}
}

func TestSAUpdateApply(t *testing.T) {
	cur := gcmConfig(t, 5)
	n := fullConfig(t)
	got := SAUpdate{Config: n, Fields: FieldDst | FieldEncap | FieldTTL}.Apply(cur)
	want := cur
	want.Dst, want.EncapSrcPort, want.EncapDstPort, want.TTL = n.Dst, n.EncapSrcPort, n.EncapDstPort, n.TTL
	want.EncKey, want.IntegKey = nil, nil
	if !sameConfig(got, want) || got.EncKey != nil {
		t.Fatalf("got %v want %v", got, want)
	}
	n.SPI = cur.SPI // the SPI names the state; it is no field
	if all := (SAUpdate{Config: n, Fields: FieldsAll}).Apply(cur); !sameConfig(all, n) {
		t.Fatalf("FieldsAll: got %v want %v", all, n)
	}
}

func TestSAInfoRoundTrip(t *testing.T) {
	in := SAInfo{Config: fullConfig(t), Stats: sampleStats(), ReplayTop: 1 << 40}
	msg := encode(t, MsgSAGet, FlagReply, 1, func(b *Builder) { PutSAInfo(b, in) })
	if bytes.Contains(msg, in.Config.EncKey) || bytes.Contains(msg, in.Config.IntegKey) {
		t.Fatal("SA_GET reply carries key material")
	}
	got, err := ReadSAInfo(decodeOK(t, msg).Attrs)
	if err != nil {
		t.Fatal(err)
	}
	want := in.Config
	want.EncKey, want.IntegKey = nil, nil
	if !sameConfig(got.Config, want) || got.Config.EncKey != nil {
		t.Fatalf("config:\n got %v\nwant %v", got.Config, want)
	}
	if !reflect.DeepEqual(got.Stats.Drops, in.Stats.Drops) || got.ReplayTop != in.ReplayTop ||
		!got.Stats.AddTime.Equal(in.Stats.AddTime) || !got.Stats.FirstUse.Equal(in.Stats.FirstUse) ||
		got.Stats.State != in.Stats.State || got.Stats.Packets != in.Stats.Packets ||
		got.Stats.Bytes != in.Stats.Bytes || got.Stats.SeqOut != in.Stats.SeqOut {
		t.Fatalf("stats:\n got %+v\nwant %+v", got.Stats, in.Stats)
	}
}

func TestDropTablesComplete(t *testing.T) {
	if len(dropAttrs) != int(sa.NumDropReasons) {
		t.Fatalf("%d drop reasons on the wire, sa has %d", len(dropAttrs), sa.NumDropReasons)
	}
	for r, a := range dropAttrs {
		if _, ok := saStatNames[a]; !ok {
			t.Errorf("drop %v (%d) has no name", r, a)
		}
	}
	for _, st := range []sa.State{sa.StateLarval, sa.StateValid, sa.StateSoftExpired, sa.StateDead} {
		if _, ok := stateToWire[st]; !ok {
			t.Errorf("state %v has no wire value", st)
		}
	}
}

// TestDropOtherRetired: espd no longer sends ST_DROP_OTHER (27), and
// GLOBAL_STATS from an older daemon that does still reads, its other
// counters intact.
func TestDropOtherRetired(t *testing.T) {
	g := sampleGlobal()
	for i := range g.Drops {
		g.Drops[i] = uint64(100 + i)
	}
	m := decodeOK(t, encode(t, MsgStats, FlagReply|FlagMulti, 1, func(b *Builder) { PutGlobalStats(b, g) }))
	n, ok := newReader(m.Attrs).nest(AttrGlobalStats, spaceGlobalStats)
	if !ok {
		t.Fatal("no GLOBAL_STATS")
	}
	for _, a := range n.attrs {
		if a.Type == StDropOther {
			t.Error("GLOBAL_STATS carries GS_DROP_OTHER (27)")
		}
	}
	old := decodeOK(t, encode(t, MsgStats, FlagReply|FlagMulti, 1, func(b *Builder) {
		b.Nest(AttrGlobalStats)
		b.U64(StDropReplay, 5)
		b.U64(StDropOther, 7)
		b.U64(StDropTooBig, 9)
		b.End()
	}))
	n, ok = newReader(old.Attrs).nest(AttrGlobalStats, spaceGlobalStats)
	if !ok {
		t.Fatal("no GLOBAL_STATS")
	}
	var want [sa.NumDropReasons]uint64
	want[sa.DropReplay], want[sa.DropTooBig] = 5, 9
	if got := readGlobalCounters(n); got.Drops != want || n.err != nil {
		t.Errorf("drops from an older daemon: %v (%v), want %v", got.Drops, n.err, want)
	}
}

func TestGlobalStatsRoundTrip(t *testing.T) {
	g := sampleGlobal()
	m := decodeOK(t, encode(t, MsgStats, FlagReply|FlagMulti, 1, func(b *Builder) { PutGlobalStats(b, g) }))
	r := newReader(m.Attrs)
	n, ok := r.nest(AttrGlobalStats, spaceGlobalStats)
	if !ok {
		t.Fatal("no GLOBAL_STATS")
	}
	if got := readGlobalCounters(n); got != g || n.err != nil {
		t.Fatalf("got %+v (%v) want %+v", got, n.err, g)
	}
}

func TestPolicyRoundTrip(t *testing.T) {
	p := fullPolicy()
	got, err := ReadPolicy(decodeOK(t, encode(t, MsgPolicyAdd, 0, 1, func(b *Builder) { PutPolicy(b, p) })).Attrs)
	if err != nil || got != p {
		t.Fatalf("got %v (%v) want %v", got, err, p)
	}
	id, err := ReadPolicyID(decodeOK(t, encode(t, MsgPolicyDel, 0, 1, func(b *Builder) { PutPolicyID(b, p.ID()) })).Attrs)
	if err != nil || id != p.ID() {
		t.Fatalf("id: %v %v", id, err)
	}
	// IF_ID is absent for interface 0.
	p.IfID = 0
	m := decodeOK(t, encode(t, MsgPolicyDel, 0, 1, func(b *Builder) { PutPolicyID(b, p.ID()) }))
	for _, a := range m.Attrs {
		if a.Type == AttrIfID {
			t.Errorf("IF_ID sent for interface 0")
		}
	}
	// ACTION defaults to protect.
	def, err := ReadPolicy(decodeOK(t, encode(t, MsgPolicyAdd, 0, 1, func(b *Builder) {
		putSelector(b, AttrSelector, sa.Selector{})
		b.U32(AttrDir, DirOut)
	})).Attrs)
	if err != nil || def.Action != sa.ActionProtect || def.Dir != sa.DirOut {
		t.Fatalf("defaults: %v %v", def, err)
	}
}

func TestEventRoundTrip(t *testing.T) {
	for _, e := range sampleEvents() {
		got, err := ReadEvent(decodeOK(t, encode(t, MsgEvent, 0, 1, func(b *Builder) { PutEvent(b, e) })).Attrs)
		if err != nil {
			t.Fatalf("%v: %v", e, err)
		}
		if !got.Time.Equal(e.Time) {
			t.Fatalf("time %v want %v", got.Time, e.Time)
		}
		got.Time = e.Time
		if !reflect.DeepEqual(got, e) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, e)
		}
	}
}

func TestEventFromSA(t *testing.T) {
	p := fullPolicy()
	e := EventFromSA(sa.Event{Kind: sa.EventAcquire, Dst: v4b, ReqID: 5, Dir: sa.DirOut, Policy: p})
	if e.Kind != EventAcquire || e.Policy != p || e.ReqID != 5 || e.Dst != v4b {
		t.Fatalf("acquire: %+v", e)
	}
	e = EventFromSA(sa.Event{Kind: sa.EventHardExpire, SPI: 9, Dst: v4a, Reason: sa.ExpireAddTime})
	if e.Kind != EventHardExpire || e.SPI != 9 || e.Reason != sa.ExpireAddTime {
		t.Fatalf("expire: %+v", e)
	}
}

func TestErrorAndHelloRoundTrip(t *testing.T) {
	in := &Error{Code: EPROTONOSUPPORT, Msg: "protocol version 2 not supported; this server speaks 1",
		Type: MsgHello, Attr: AttrVersion, Versions: []uint8{1}}
	got, err := ReadError(decodeOK(t, encode(t, MsgError, FlagReply, 1, func(b *Builder) { PutError(b, in) })).Attrs)
	if err != nil || !reflect.DeepEqual(got, in) {
		t.Fatalf("got %+v (%v)", got, err)
	}
	if !errors.Is(got, syscall.EPROTONOSUPPORT) {
		t.Fatal("errors.Is with syscall.EPROTONOSUPPORT")
	}
	h := HelloInfo{Version: 1, Software: "espd", MaxMessageSize: MaxMessageSize}
	gh, err := ReadHelloReply(decodeOK(t, encode(t, MsgHello, FlagReply, 1, func(b *Builder) { PutHelloReply(b, h) })).Attrs)
	if err != nil || gh != h {
		t.Fatalf("hello %+v %v", gh, err)
	}
}

func TestSuiteAttributes(t *testing.T) {
	read := func(fill func(*Builder)) (crypto.Suite, error) {
		m := decodeOK(t, encode(t, MsgSAAdd, 0, 1, fill))
		r := newReader(m.Attrs)
		s, _ := readSuite(r)
		return s, r.error()
	}
	gcm := crypto.Suite{Encryption: crypto.EncrAESGCM16, KeyBits: 128}
	cases := []struct {
		name string
		fill func(*Builder)
		want crypto.Suite
		err  string
	}{
		{"ids", func(b *Builder) { b.U32(AttrEncAlg, 20); b.U32(AttrEncKeyLen, 128) }, gcm, ""},
		{"name", func(b *Builder) { b.String(AttrAlgName, "aes128gcm16") }, gcm, ""},
		{"name with NUL", func(b *Builder) { b.Raw(AttrAlgName, []byte("aes128gcm16\x00")) }, gcm, ""},
		{"both agree", func(b *Builder) {
			b.String(AttrAlgName, "aes128gcm16")
			b.U32(AttrEncAlg, 20)
			b.U32(AttrEncKeyLen, 128)
		}, gcm, ""},
		{"esn by name", func(b *Builder) { b.String(AttrAlgName, "aes128gcm16-esn") }, crypto.Suite{Encryption: crypto.EncrAESGCM16, KeyBits: 128, ESN: true}, ""},
		{"esn attr", func(b *Builder) { b.U32(AttrEncAlg, 20); b.U32(AttrEncKeyLen, 128); b.Bool(AttrESN, true) }, crypto.Suite{Encryption: crypto.EncrAESGCM16, KeyBits: 128, ESN: true}, ""},
		{"cbc ids", func(b *Builder) { b.U32(AttrEncAlg, 12); b.U32(AttrEncKeyLen, 256); b.U32(AttrIntegAlg, 12) },
			crypto.Suite{Encryption: crypto.EncrAESCBC, KeyBits: 256, Integrity: crypto.AuthHMACSHA2256128}, ""},
		{"chacha no keylen", func(b *Builder) { b.U32(AttrEncAlg, 28) }, crypto.Suite{Encryption: crypto.EncrChaCha20Poly1305, KeyBits: 256}, ""},
		{"disagree", func(b *Builder) {
			b.String(AttrAlgName, "aes256gcm16")
			b.U32(AttrEncAlg, 20)
			b.U32(AttrEncKeyLen, 128)
		}, crypto.Suite{}, "disagrees"},
		{"bad name", func(b *Builder) { b.String(AttrAlgName, "rot13") }, crypto.Suite{}, "rot13"},
		{"unsupported id", func(b *Builder) { b.U32(AttrEncAlg, 3) }, crypto.Suite{}, "ENCR_3DES"},
		{"keylen alone", func(b *Builder) { b.U32(AttrEncKeyLen, 128) }, crypto.Suite{}, "without ENC_ALG"},
		{"bad utf8", func(b *Builder) { b.Raw(AttrAlgName, []byte{0xff, 0xfe}) }, crypto.Suite{}, "UTF-8"},
	}
	for _, c := range cases {
		got, err := read(c.fill)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want one containing %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: got %v (%v), want %v", c.name, got, err, c.want)
		}
	}
}

// TestTypedRejects checks the typed decoders on well-framed but
// inconsistent messages.
func TestTypedRejects(t *testing.T) {
	cfg := fullConfig(t)
	saAdd := func(extra func(*Builder)) func() error {
		return func() error {
			m := decodeOK(t, encode(t, MsgSAAdd, 0, 1, extra))
			_, err := ReadSAAdd(m.Attrs)
			return err
		}
	}
	base := func(b *Builder) { putSAConfig(b, cfg, true) }
	cases := []struct {
		name string
		run  func() error
		code Errno
		want string
	}{
		{"missing spi", saAdd(func(b *Builder) { putSAFields(b, cfg, FieldsAll, false) }), EINVAL, "missing required SPI"},
		{"missing alg", saAdd(func(b *Builder) {
			b.U32(AttrSPI, 1)
			putSAFields(b, cfg, FieldsAll&^FieldSuite, false)
		}), EINVAL, "missing algorithm"},
		{"duplicate spi", saAdd(func(b *Builder) { base(b); b.U32(AttrSPI, 2) }), EBADMSG, "duplicate SPI"},
		{"short spi", saAdd(func(b *Builder) { b.Raw(AttrSPI, []byte{1, 2}) }), EBADMSG, "want 4"},
		{"bad address", saAdd(func(b *Builder) { b.U32(AttrSPI, 1); b.Raw(AttrSrc, []byte{1, 2, 3, 4, 5, 6, 7, 8}) }), EBADMSG, "want 4 or 16"},
		{"mixed families", saAdd(func(b *Builder) { b.U32(AttrSPI, 1); b.Addr(AttrSrc, v4a); b.Addr(AttrDst, v6a) }), EINVAL, "different families"},
		{"dir fwd", saAdd(func(b *Builder) { b.U32(AttrSPI, 1); b.U32(AttrDir, DirFwd) }), EINVAL, "DIR"},
		{"ah", saAdd(func(b *Builder) { b.U32(AttrProto, 51) }), EPROTONOSUPPORT, "ESP (50) only"},
		{"duplicate mode", saAdd(func(b *Builder) { base(b); b.U32(AttrMode, 3) }), EBADMSG, "duplicate MODE"},
		{"mode 0", saAdd(func(b *Builder) { b.U32(AttrMode, 0) }), EINVAL, "MODE (6) of a state must be 1 (transport) or 2 (tunnel), not 0"},
		{"ttl range", saAdd(func(b *Builder) { b.U32(AttrTTL, 256) }), EINVAL, "out of range"},
		{"dscp range", saAdd(func(b *Builder) { b.U32(AttrDSCP, 64) }), EINVAL, "out of range"},
		{"bool range", saAdd(func(b *Builder) { b.U32(AttrECN, 2) }), EINVAL, "want 0 or 1"},
		{"df range", saAdd(func(b *Builder) { b.U32(AttrDF, 3) }), EINVAL, "DF"},
		{"prefix length", saAdd(func(b *Builder) {
			b.Nest(AttrSelector)
			b.Raw(SelSrc, []byte{33, 0, 0, 0, 198, 18, 0, 0})
			b.End()
		}), EINVAL, "exceeds 32"},
		{"prefix reserved", saAdd(func(b *Builder) {
			b.Nest(AttrSelector)
			b.Raw(SelSrc, []byte{24, 1, 0, 0, 198, 18, 0, 0})
			b.End()
		}), EBADMSG, "reserved prefix bytes"},
		{"selector families", saAdd(func(b *Builder) {
			putSelector(b, AttrSelector, sa.Selector{Src: netip.MustParsePrefix("198.18.0.0/16"), Dst: netip.MustParsePrefix("2001:db8::/32")})
		}), EINVAL, "different families"},
		{"bad nest", saAdd(func(b *Builder) { b.Raw(AttrSelector, []byte{0, 9, 0, 1}) }), EBADMSG, "SELECTOR (17): attribute 1"},
		{"lifetime overflow", saAdd(func(b *Builder) { b.Nest(AttrLifeHard); b.U64(LtAddTime, 1<<63); b.End() }), EINVAL, "overflows"},
		{"policy no selector", func() error {
			_, err := ReadPolicy(decodeOK(t, encode(t, MsgPolicyAdd, 0, 1, func(b *Builder) { b.U32(AttrDir, DirOut) })).Attrs)
			return err
		}, EINVAL, "missing required SELECTOR"},
		{"policy two selectors", func() error {
			_, err := ReadPolicy(decodeOK(t, encode(t, MsgPolicyAdd, 0, 1, func(b *Builder) {
				PutPolicy(b, fullPolicy())
				putSelector(b, AttrSelector, sa.Selector{})
			})).Attrs)
			return err
		}, EBADMSG, "duplicate SELECTOR"},
		{"policy action", func() error {
			_, err := ReadPolicy(decodeOK(t, encode(t, MsgPolicyAdd, 0, 1, func(b *Builder) {
				PutPolicyID(b, sa.PolicyID{Dir: sa.DirIn})
				b.U32(AttrAction, 9)
			})).Attrs)
			return err
		}, EINVAL, "ACTION"},
		{"event without type", func() error {
			_, err := ReadEvent(decodeOK(t, encode(t, MsgEvent, 0, 1, func(b *Builder) { b.U32(AttrSPI, 1) })).Attrs)
			return err
		}, EINVAL, "EVENT_TYPE"},
		{"deep nesting", func() error {
			m := decodeOK(t, encode(t, MsgSAAdd, 0, 1, func(b *Builder) {
				for range MaxNesting + 2 {
					b.Nest(AttrSelector)
				}
				for range MaxNesting + 2 {
					b.End()
				}
			}))
			r := newReader(m.Attrs)
			n := r.nested(m.Attrs[0], spaceTop)
			for range MaxNesting + 1 {
				if len(n.attrs) == 0 {
					break
				}
				n = n.nested(n.attrs[0], spaceTop)
			}
			return n.error()
		}, EBADMSG, "nested deeper"},
	}
	for _, c := range cases {
		err := c.run()
		var e *Error
		if !errors.As(err, &e) || e.Code != c.code || !strings.Contains(e.Msg, c.want) {
			t.Errorf("%s: error %v, want %v containing %q", c.name, err, c.code, c.want)
		}
	}
}

func TestSampleMessagesDecode(t *testing.T) {
	for i, msg := range sampleMessages(t) {
		m, err := Decode(msg)
		if err != nil {
			t.Fatalf("sample %d: %v", i, err)
		}
		if err := decodeTyped(m); err != nil {
			t.Fatalf("sample %d (%v): %v", i, m.Type, err)
		}
	}
}

func TestAttrName(t *testing.T) {
	for _, c := range []struct {
		in, t AttrType
		want  string
	}{
		{0, AttrDir, "DIR (4)"},
		{0, 999, "attribute 999"},
		{AttrLifeSoft, LtBytes, "LT_BYTES (1)"},
		{AttrSelector, SelSrcPorts, "SEL_SRC_PORTS (4)"},
		{AttrGlobalStats, StDropReplay, "GS_DROP_REPLAY (16)"},
		{AttrSPI, 1, "attribute 1"},
	} {
		if got := AttrName(c.in, c.t); got != c.want {
			t.Errorf("AttrName(%d, %d) = %q, want %q", c.in, c.t, got, c.want)
		}
	}
}
