package control

import (
	"testing"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/sa"
)

// TestSAUpdateFixedAttrs: an SA_UPDATE giving a state's algorithm, ESN,
// keys, REQID, (inbound) REPLAY_WINDOW, NEGOTIATED or MODE another value than
// the state's is refused with EINVAL and ERR_ATTR naming the attribute
// it carried, and the state is unchanged; the state's own values are
// accepted. ESN alone was answered OK and ignored (issue 19, item 9).
func TestSAUpdateFixedAttrs(t *testing.T) {
	ts := startServer(t, ServerConfig{})
	c := dial(t, ts.path)
	rc := rawDial(t, ts.path)
	ctx := testCtx(t)
	cbc := mustSuite(t, "aes128-sha256")
	seq := uint32(100)
	for _, esn := range []bool{false, true} {
		base := gcmConfig(t, 0x2000)
		base.Suite.ESN = esn
		other := gcmConfig(t, 0x2001)
		other.Suite = cbc
		other.Suite.ESN = esn
		other.EncKey, other.IntegKey = key(cbc.EncKeyLen(), 40), key(cbc.IntegKeyLen(), 80)
		for _, tc := range []struct {
			name string
			cfg  sa.Config
			fill func(*wire.Builder)
			want wire.AttrType // 0: accepted
		}{
			{"ESN on/off", base, func(b *wire.Builder) { b.Bool(wire.AttrESN, !esn) }, wire.AttrESN},
			{"ESN unchanged", base, func(b *wire.Builder) { b.Bool(wire.AttrESN, esn) }, 0},
			{"ALG_NAME with ESN flipped", base, func(b *wire.Builder) {
				s := base.Suite
				s.ESN = !esn
				b.String(wire.AttrAlgName, s.String())
			}, wire.AttrAlgName},
			{"ALG_NAME and ESN flipped", base, func(b *wire.Builder) {
				b.String(wire.AttrAlgName, "aes128gcm16")
				b.Bool(wire.AttrESN, !esn)
			}, wire.AttrESN},
			{"ALG_NAME", base, func(b *wire.Builder) { b.String(wire.AttrAlgName, "aes256gcm16") }, wire.AttrAlgName},
			{"ALG_NAME unchanged", base, func(b *wire.Builder) { b.String(wire.AttrAlgName, base.Suite.String()) }, 0},
			{"ENC_ALG", base, func(b *wire.Builder) {
				b.U32(wire.AttrEncAlg, uint32(crypto.EncrAESGCM16))
				b.U32(wire.AttrEncKeyLen, 256)
				b.Bool(wire.AttrESN, esn)
			}, wire.AttrEncAlg},
			{"ENC_KEY", base, func(b *wire.Builder) { b.Raw(wire.AttrEncKey, key(base.Suite.EncKeyLen(), 200)) }, wire.AttrEncKey},
			{"ENC_KEY unchanged", base, func(b *wire.Builder) { b.Raw(wire.AttrEncKey, base.EncKey) }, 0},
			{"INTEG_KEY", other, func(b *wire.Builder) {
				b.Raw(wire.AttrIntegKey, key(cbc.IntegKeyLen(), 1))
				b.Raw(wire.AttrEncKey, other.EncKey)
			}, wire.AttrEncKey},
			{"REQID", base, func(b *wire.Builder) { b.U32(wire.AttrReqID, base.ReqID+1) }, wire.AttrReqID},
			{"REPLAY_WINDOW", base, func(b *wire.Builder) { b.U32(wire.AttrReplayWindow, 128) }, wire.AttrReplayWindow},
			{"NEGOTIATED", base, func(b *wire.Builder) { b.Bool(wire.AttrNegotiated, true) }, wire.AttrNegotiated},
			{"MODE", base, func(b *wire.Builder) { b.U32(wire.AttrMode, wire.ModeTransport) }, wire.AttrMode},
			{"MODE unchanged", base, func(b *wire.Builder) { b.U32(wire.AttrMode, wire.ModeTunnel) }, 0},
		} {
			what := tc.name
			if esn {
				what += " (ESN state)"
			}
			if err := c.FlushSAs(ctx); err != nil {
				t.Fatal(err)
			}
			if err := c.AddSA(ctx, tc.cfg); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			seq++
			rc.send(encode(t, wire.MsgSAUpdate, 0, seq, func(b *wire.Builder) {
				b.U32(wire.AttrSPI, tc.cfg.SPI)
				b.Addr(wire.AttrDst, tc.cfg.Dst)
				tc.fill(b)
			}))
			if tc.want == 0 {
				if m, err := rc.read(); err != nil || m.Type != wire.MsgSAUpdate || m.Seq != seq {
					t.Fatalf("%s: want OK, got %v %v", what, m, err)
				}
			} else if e := rc.wantError(seq, wire.EINVAL); e.Attr != tc.want {
				t.Errorf("%s: ERROR %q names attribute %d, want %s", what, e.Msg, e.Attr, wire.AttrName(0, tc.want))
			}
			got, err := c.GetSA(ctx, tc.cfg.SPI, tc.cfg.Dst)
			if err != nil {
				t.Fatal(err)
			}
			if g := got.Config; g.Suite != tc.cfg.Suite || g.ReqID != tc.cfg.ReqID || g.ReplayWindow != tc.cfg.ReplayWindow || g.Negotiated || g.Mode != tc.cfg.Mode {
				t.Errorf("%s: the state changed: %v", what, g)
			}
		}
	}
}
