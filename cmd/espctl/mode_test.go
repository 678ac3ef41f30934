package main

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/sa"
)

// TestModeFlags: sa add and sa update send --mode only when it is given
// (espd's default is tunnel mode), as FieldMode; policy add takes it for
// the template, tunnel when absent.
func TestModeFlags(t *testing.T) {
	add := []string{"--spi", "0x1000", "--src", "198.18.0.1", "--dst", "198.18.0.2", "--dir", "out", "--enc", "aes128gcm16", "--enc-key-file", "-"}
	for _, tc := range []struct {
		args  []string
		mode  sa.Mode
		field bool
	}{
		{nil, sa.ModeTunnel, false},
		{[]string{"--mode", "tunnel"}, sa.ModeTunnel, true},
		{[]string{"--mode", "transport"}, sa.ModeTransport, true},
		{[]string{"--mode=transport"}, sa.ModeTransport, true},
	} {
		c, fields, err := parseSAStdin(t, "sa add", true, []string{"config"}, gcmKey, append(add, tc.args...)...)
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if c.Mode != tc.mode || (fields&wire.FieldMode != 0) != tc.field {
			t.Errorf("sa add %q: mode %v, FieldMode %v; want %v, %v", tc.args, c.Mode, fields&wire.FieldMode != 0, tc.mode, tc.field)
		}
	}
	c, fields, err := parseSA(t, "sa update", false, []string{"config", "update"}, "--spi", "0x10", "--dst", "198.18.0.2", "--mode", "transport")
	if err != nil || fields != wire.FieldMode || c.Mode != sa.ModeTransport {
		t.Fatalf("sa update --mode transport: %v fields %b (%v)", c, fields, err)
	}

	for _, tc := range []struct {
		args []string
		mode sa.Mode
	}{
		{nil, sa.ModeTunnel},
		{[]string{"--mode", "tunnel"}, sa.ModeTunnel},
		{[]string{"--mode", "transport"}, sa.ModeTransport},
	} {
		f := newPolicyFlags("policy add", true)
		if err := f.parse(append([]string{"--src", "198.18.0.1", "--dst", "198.18.0.2", "--dir", "out", "--reqid", "7"}, tc.args...)); err != nil {
			t.Fatal(err)
		}
		p, err := f.policy()
		if err != nil || p.Mode != tc.mode {
			t.Errorf("policy add %q: %v (%v), want mode %v", tc.args, p, err, tc.mode)
		}
	}
}

// TestPrintMode: sa get shows the state's mode where it always showed
// "mode tunnel"; a policy shows its template, with the mode, when the
// template has addresses or is transport mode; --json has "mode" for
// both.
func TestPrintMode(t *testing.T) {
	in := sampleInfo()
	in.Config.Mode = sa.ModeTransport
	var b bytes.Buffer
	printSA(&b, in, in.Stats.AddTime)
	if !strings.Contains(b.String(), "\tsrc 198.18.0.1 dst 198.18.0.2 proto esp mode transport encap udp 4500 -> 4500\n") {
		t.Errorf("transport state:\n%s", b.String())
	}
	b.Reset()
	writeJSON(&b, saView(in))
	var m map[string]any
	if err := json.Unmarshal(b.Bytes(), &m); err != nil || m["mode"] != "transport" {
		t.Errorf("transport state JSON: %s", b.String())
	}

	hosts := sa.Selector{Src: netip.MustParsePrefix("198.18.0.1/32"), Dst: netip.MustParsePrefix("198.18.0.2/32")}
	for _, tc := range []struct {
		p    sa.Policy
		want string // the template line, "" for none
		mode string
	}{
		{sa.Policy{Selector: hosts, Dir: sa.DirOut, ReqID: 7, Mode: sa.ModeTransport}, "\ttmpl src any dst any proto esp mode transport\n", "transport"},
		{sa.Policy{Selector: hosts, Dir: sa.DirOut, ReqID: 7, Mode: sa.ModeTransport,
			TmplSrc: netip.MustParseAddr("198.18.0.1"), TmplDst: netip.MustParseAddr("198.18.0.2")},
			"\ttmpl src 198.18.0.1 dst 198.18.0.2 proto esp mode transport\n", "transport"},
		{sa.Policy{Selector: hosts, Dir: sa.DirOut, ReqID: 7}, "", "tunnel"},
	} {
		b.Reset()
		printPolicy(&b, tc.p)
		out := b.String()
		if (tc.want == "" && strings.Contains(out, "tmpl")) || !strings.HasSuffix(out, "reqid 7\n"+tc.want) {
			t.Errorf("policy %v:\n%q\nwant the template line %q", tc.p, out, tc.want)
		}
		b.Reset()
		writeJSON(&b, policyView(tc.p))
		var m map[string]any
		if err := json.Unmarshal(b.Bytes(), &m); err != nil || m["mode"] != tc.mode {
			t.Errorf("policy %v JSON: %s, want mode %q", tc.p, b.String(), tc.mode)
		}
	}
}

// TestTransportModeEndToEnd: through espd's control socket, sa add and
// policy add with --mode transport install transport-mode states and
// policies, which sa get, sa list and policy list show; sa update cannot
// change the mode, and a transport-mode state takes no TFC padding, on add
// or on update, each refused with sa's reason and exit code 1.
func TestTransportModeEndToEnd(t *testing.T) {
	d := startDaemon(t)
	dst := netip.MustParseAddr("198.18.0.2")
	add := []string{"sa", "add", "--spi", "0x3001", "--dir", "out", "--src", "198.18.0.1", "--dst", "198.18.0.2",
		"--enc", "aes128gcm16", "--enc-key-file", "-", "--reqid", "7"}
	d.espctlIn(t, 0, gcmKey, append(add, "--mode", "transport")...)
	if s, ok := d.db.GetSA(0x3001, dst); !ok || s.Mode() != sa.ModeTransport {
		t.Fatalf("sa add --mode transport: %v", s)
	}
	out, _ := d.espctl(t, 0, "sa", "get", "--spi", "0x3001", "--dst", "198.18.0.2")
	if !strings.Contains(out, "proto esp mode transport\n") {
		t.Errorf("sa get:\n%s", out)
	}
	out, _ = d.espctl(t, 0, "--json", "sa", "list")
	var list []map[string]any
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 || list[0]["mode"] != "transport" {
		t.Errorf("sa list --json: %v\n%s", err, out)
	}

	out, _ = d.espctl(t, 0, "policy", "add", "--dir", "out", "--src", "198.18.0.1/32", "--dst", "198.18.0.2/32", "--mode", "transport", "--reqid", "7")
	if !strings.Contains(out, "\ttmpl src any dst any proto esp mode transport\n") {
		t.Errorf("policy add:\n%s", out)
	}
	id := sa.PolicyID{Selector: sa.Selector{Src: netip.MustParsePrefix("198.18.0.1/32"), Dst: netip.MustParsePrefix("198.18.0.2/32")}, Dir: sa.DirOut}
	if p, ok := d.db.GetPolicy(id); !ok || p.Mode != sa.ModeTransport {
		t.Fatalf("policy add --mode transport: %v", p)
	}
	if out, _ := d.espctl(t, 0, "policy", "list"); !strings.Contains(out, "mode transport") {
		t.Errorf("policy list:\n%s", out)
	}

	for _, tc := range []struct {
		stdin string
		args  []string
		want  string
	}{
		{"", []string{"sa", "update", "--spi", "0x3001", "--dst", "198.18.0.2", "--mode", "tunnel"}, "cannot change the mode (transport to tunnel)"},
		{"", []string{"sa", "update", "--spi", "0x3001", "--dst", "198.18.0.2", "--tfc", "500"}, "transport mode takes no TFC padding (tfc 500)"},
		{strings.Replace(gcmKey, "00", "ff", 1), append(append([]string{}, add...), "--spi", "0x3002", "--mode", "transport", "--tfc", "300"),
			"transport mode takes no TFC padding (tfc 300)"},
	} {
		_, stderr := d.espctlIn(t, exitError, tc.stdin, tc.args...)
		if !strings.Contains(stderr, tc.want) {
			t.Errorf("%q: %q, want %q", tc.args, stderr, tc.want)
		}
	}
	if s, ok := d.db.GetSA(0x3001, dst); !ok || s.Mode() != sa.ModeTransport || s.Config().TFCPadTo != 0 {
		t.Errorf("the state changed: %v", s)
	}
	if _, ok := d.db.GetSA(0x3002, dst); ok {
		t.Error("a transport-mode state with TFC padding was installed")
	}
	// The state's own mode is accepted.
	d.espctl(t, 0, "sa", "update", "--spi", "0x3001", "--dst", "198.18.0.2", "--mode", "transport", "--ttl", "30")
}
