package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/control"
	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
	"github.com/espd/espd/packet"
	"github.com/espd/espd/sa"
)

func sampleInfo() wire.SAInfo {
	st := sa.Stats{State: sa.StateValid, Packets: 10, Bytes: 1500, SeqOut: 10,
		AddTime: time.Date(2024, 1, 2, 3, 4, 5, 0, time.UTC), FirstUse: time.Date(2024, 1, 2, 3, 5, 5, 0, time.UTC)}
	st.Drops[sa.DropReplay] = 2
	st.Drops[sa.DropIntegrity] = 1
	return wire.SAInfo{
		Config: sa.Config{SPI: 0xc0000001, Dir: sa.DirOut, Src: netip.MustParseAddr("198.18.0.1"), Dst: netip.MustParseAddr("198.18.0.2"),
			Suite: crypto.Suite{Encryption: crypto.EncrAESCBC, KeyBits: 256, Integrity: crypto.AuthHMACSHA2256128},
			ReqID: 7, EncapSrcPort: 4500, EncapDstPort: 4500,
			Selectors: []sa.Selector{{Src: netip.MustParsePrefix("198.18.1.0/24"), Dst: netip.MustParsePrefix("198.19.0.0/16"), Proto: 6,
				DstPorts: sa.PortRange{Lo: 443, Hi: 443}}},
			Soft: sa.Lifetime{Bytes: 1 << 20, AddTime: 50 * time.Minute},
			Hard: sa.Lifetime{AddTime: time.Hour},
			TTL:  0, DSCP: 46, DF: esp.DFSet, TFCPadTo: 0},
		Stats: st,
	}
}

func TestPrintSA(t *testing.T) {
	var b bytes.Buffer
	now := time.Date(2024, 1, 2, 3, 14, 5, 0, time.UTC)
	printSA(&b, sampleInfo(), now)
	out := b.String()
	for _, want := range []string{
		"spi 0xc0000001 dir out state valid reqid 7\n",
		"\tsrc 198.18.0.1 dst 198.18.0.2 proto esp mode tunnel encap udp 4500 -> 4500\n",
		"\talg aes256-sha256 (ENCR_AES_CBC 256, AUTH_HMAC_SHA2_256_128) keys [redacted] keying manual\n",
		"\tseq-out 10\n",
		"\tsel src 198.18.1.0/24 dst 198.19.0.0/16 proto tcp dport 443\n",
		"\touter ttl 64 dscp 46 df set ecn off tfc 0\n",
		"\tlifetime soft: 1048576 bytes, add 50m0s\n",
		"\tlifetime hard: add 1h0m0s\n",
		"\tcurrent: 1500 bytes, 10 packets\n",
		"(10m0s ago), first used ",
		"(9m0s ago)\n",
		"\tdrops: replay 2, integrity 1\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
	in := sampleInfo()
	in.Config.Dir, in.ReplayTop, in.Config.ReplayWindow, in.Config.Selectors = sa.DirIn, 99, 64, nil
	b.Reset()
	printSA(&b, in, now)
	for _, want := range []string{"\treplay-window 64 replay-top 99\n", "\tsel any\n", "\tecn off\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("inbound: missing %q in\n%s", want, b.String())
		}
	}
	in = sampleInfo()
	in.Config.Negotiated = true
	b.Reset()
	printSA(&b, in, now)
	if want := " keys [redacted] keying negotiated\n"; !strings.Contains(b.String(), want) {
		t.Errorf("negotiated: missing %q in\n%s", want, b.String())
	}
	b.Reset()
	printSA(&b, wire.SAInfo{Config: sa.Config{SPI: 0x100}, Stats: sa.Stats{State: sa.StateLarval, AddTime: now}}, now)
	if !strings.HasPrefix(b.String(), "spi 0x00000100 dir in state larval (SPI reserved") {
		t.Errorf("larval: %q", b.String())
	}
}

// TestNoKeysInOutput feeds a configuration that still holds keys (which the
// daemon never returns) through every formatter: no key byte may appear.
func TestNoKeysInOutput(t *testing.T) {
	in := sampleInfo()
	in.Config.EncKey = bytes.Repeat([]byte{0xa7}, 32)
	in.Config.IntegKey = bytes.Repeat([]byte{0x5c}, 32)
	var b bytes.Buffer
	printSA(&b, in, time.Now())
	writeJSON(&b, saView(in))
	writeJSON(&b, []saJSON{saView(in)})
	out := strings.ToLower(b.String())
	for _, k := range [][]byte{in.Config.EncKey[:4], in.Config.IntegKey[:4]} {
		if strings.Contains(out, hex.EncodeToString(k)) {
			t.Fatalf("key material in output:\n%s", out)
		}
	}
	if !strings.Contains(out, `"keys":"[redacted]"`) {
		t.Fatalf("no redacted marker in JSON:\n%s", out)
	}
}

func TestSAJSON(t *testing.T) {
	var b bytes.Buffer
	if err := writeJSON(&b, saView(sampleInfo())); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	checks := map[string]any{
		"spi": float64(0xc0000001), "spi_hex": "0xc0000001", "dir": "out", "state": "valid", "src": "198.18.0.1",
		"alg": "aes256-sha256", "enc_alg": float64(12), "enc_key_bits": float64(256), "integ_alg": float64(12),
		"keys": "[redacted]", "encap_sport": float64(4500), "df": "set", "dscp": float64(46), "reqid": float64(7),
		"negotiated": false,
	}
	for k, v := range checks {
		if m[k] != v {
			t.Errorf("%s = %v, want %v", k, m[k], v)
		}
	}
	st := m["stats"].(map[string]any)
	if st["packets"] != float64(10) || st["add_time"] != "2024-01-02T03:04:05Z" || st["drops"].(map[string]any)["replay"] != float64(2) {
		t.Errorf("stats %v", st)
	}
	if soft := m["soft"].(map[string]any); soft["add_seconds"] != float64(3000) || soft["bytes"] != float64(1<<20) {
		t.Errorf("soft %v", soft)
	}
	if sel := m["selectors"].([]any)[0].(map[string]any); sel["dst"] != "198.19.0.0/16" || sel["dport"] != "443" || sel["sport"] != "any" {
		t.Errorf("selector %v", sel)
	}
}

func TestPrintPolicyAndStats(t *testing.T) {
	var b bytes.Buffer
	printPolicy(&b, sa.Policy{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.0.0/16"), Proto: 17, SrcPorts: sa.PortRange{Lo: 53, Hi: 53}},
		Dir: sa.DirOut, Action: sa.ActionProtect, Priority: 10, ReqID: 4, Index: 0x11,
		TmplSrc: netip.MustParseAddr("198.18.0.1"), TmplDst: netip.MustParseAddr("198.18.0.2")})
	want := "src any dst 198.19.0.0/16 proto udp sport 53\n\tdir out action protect priority 10 index 17 reqid 4\n" +
		"\ttmpl src 198.18.0.1 dst 198.18.0.2 proto esp mode tunnel\n"
	if b.String() != want {
		t.Errorf("policy:\n%q\nwant\n%q", b.String(), want)
	}
	b.Reset()
	g := wire.GlobalStats{GlobalStats: sa.GlobalStats{States: 2, Policies: 3, Packets: 10, Bytes: 100, Acquires: 1}, InvalidSPI: 4}
	g.Drops[sa.DropReplay] = 5
	in := sampleInfo()
	printStats(&b, control.Stats{Global: g, SAs: []wire.SAInfo{in}})
	for _, want := range []string{"states 2 (larval 0), policies 3\n", "traffic: 10 packets, 100 bytes\n", "drops: replay 5\n",
		"global drops: invalid-spi 4,", "events: acquires 1 (suppressed 0), dropped 0\n",
		"spi 0xc0000001 dst 198.18.0.2 dir out reqid 7 state valid: 10 packets, 1500 bytes, drops: replay 2, integrity 1\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("stats: missing %q in\n%s", want, b.String())
		}
	}
}

func TestEventOutput(t *testing.T) {
	e := wire.Event{Kind: wire.EventAcquire, ReqID: 4, Dir: sa.DirOut, Time: time.Unix(1700000000, 0),
		Policy: sa.Policy{Dir: sa.DirOut, ReqID: 4, Index: 9},
		Flow:   packet.Flow{Src: netip.MustParseAddr("198.18.1.1"), Dst: netip.MustParseAddr("198.19.0.1"), Proto: 6, SrcPort: 1000, DstPort: 80}, Lost: 3}
	var b bytes.Buffer
	printEvent(&b, e)
	if !strings.Contains(b.String(), "acquire reqid 4 flow 198.18.1.1:1000 -> 198.19.0.1:80 proto 6") ||
		!strings.Contains(b.String(), "(3 events lost before this one)") {
		t.Errorf("event: %q", b.String())
	}
	b.Reset()
	writeJSON(&b, eventView(e))
	var m map[string]any
	json.Unmarshal(b.Bytes(), &m)
	if m["type"] != "acquire" || m["lost"] != float64(3) || m["flow"].(map[string]any)["dport"] != float64(80) ||
		m["policy"].(map[string]any)["index"] != float64(9) {
		t.Errorf("event JSON: %s", b.String())
	}
	b.Reset()
	writeJSON(&b, eventView(wire.Event{Kind: wire.EventMapping, SPI: 1, Dst: netip.MustParseAddr("198.18.0.1"),
		NewAddr: netip.MustParseAddrPort("198.18.0.9:4501")}))
	if !strings.Contains(b.String(), `"new_addr":"198.18.0.9:4501"`) {
		t.Errorf("mapping JSON: %s", b.String())
	}
}

// TestPrintIfID: states, policies and per-state counters of a route-based
// interface show its if_id, as ip-xfrm(8) does; those of espd's TUN (0)
// print as they always did. JSON always has the field.
func TestPrintIfID(t *testing.T) {
	now := time.Date(2024, 1, 2, 3, 14, 5, 0, time.UTC)
	pol := sa.Policy{Selector: sa.Selector{Dst: netip.MustParsePrefix("198.19.0.0/16")}, Dir: sa.DirOut,
		Action: sa.ActionProtect, ReqID: 4, Index: 0x11}
	for _, tc := range []struct {
		ifID                    uint32
		saLine, polLine, stLine string
	}{
		{0, "spi 0xc0000001 dir out state valid reqid 7\n",
			"\tdir out action protect priority 0 index 17 reqid 4\n",
			"spi 0xc0000001 dst 198.18.0.2 dir out reqid 7 state valid: "},
		{42, "spi 0xc0000001 dir out state valid reqid 7 if_id 42\n",
			"\tdir out action protect priority 0 index 17 reqid 4 if_id 42\n",
			"spi 0xc0000001 dst 198.18.0.2 dir out reqid 7 if_id 42 state valid: "},
		{1<<32 - 1, "reqid 7 if_id 4294967295\n", "reqid 4 if_id 4294967295\n", "reqid 7 if_id 4294967295 state valid: "},
	} {
		in := sampleInfo()
		in.Config.IfID = tc.ifID
		p := pol
		p.IfID = tc.ifID
		var b bytes.Buffer
		printSA(&b, in, now)
		if !strings.Contains(b.String(), tc.saLine) || (tc.ifID == 0 && strings.Contains(b.String(), "if_id")) {
			t.Errorf("if_id %d: sa: missing %q in\n%s", tc.ifID, tc.saLine, b.String())
		}
		b.Reset()
		printPolicy(&b, p)
		if !strings.Contains(b.String(), tc.polLine) || (tc.ifID == 0 && strings.Contains(b.String(), "if_id")) {
			t.Errorf("if_id %d: policy: missing %q in\n%s", tc.ifID, tc.polLine, b.String())
		}
		b.Reset()
		printStats(&b, control.Stats{SAs: []wire.SAInfo{in}})
		if !strings.Contains(b.String(), tc.stLine) {
			t.Errorf("if_id %d: stats: missing %q in\n%s", tc.ifID, tc.stLine, b.String())
		}

		b.Reset()
		writeJSON(&b, saView(in))
		writeJSON(&b, policyView(p))
		writeJSON(&b, statsView(control.Stats{SAs: []wire.SAInfo{in}}))
		dec := json.NewDecoder(&b)
		var s, pj map[string]any
		var st struct {
			SAs []map[string]any `json:"sas"`
		}
		for _, v := range []any{&s, &pj, &st} {
			if err := dec.Decode(v); err != nil {
				t.Fatal(err)
			}
		}
		if want := float64(tc.ifID); s["if_id"] != want || pj["if_id"] != want || len(st.SAs) != 1 || st.SAs[0]["if_id"] != want {
			t.Errorf("if_id %d: JSON sa %v, policy %v, stats %v", tc.ifID, s["if_id"], pj["if_id"], st.SAs)
		}
	}

	// An acquire names the policy that matched, with its if_id.
	e := wire.Event{Kind: wire.EventAcquire, ReqID: 4, Dir: sa.DirOut, Time: time.Unix(1700000000, 0),
		Policy: sa.Policy{Dir: sa.DirOut, ReqID: 4, IfID: 42}}
	var b bytes.Buffer
	printEvent(&b, e)
	if !strings.Contains(b.String(), " if_id 42") {
		t.Errorf("acquire: %q", b.String())
	}
	b.Reset()
	writeJSON(&b, eventView(e))
	var m map[string]any
	json.Unmarshal(b.Bytes(), &m)
	if m["policy"].(map[string]any)["if_id"] != float64(42) {
		t.Errorf("acquire JSON: %s", b.String())
	}
}
