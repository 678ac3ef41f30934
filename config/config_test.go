package config

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
	"github.com/espd/espd/sa"
)

const sample = `# gateway A, manual keying
[[sa]]
spi = 0x1001
dir = "out"
src = "198.18.0.1"
dst = "198.18.0.2"
suite = "aes128gcm16"
enc_key = "0x000102030405060708090a0b0c0d0e0f10111213"
reqid = 1
replay_window = 64
esn = true
ttl = 32
dscp = "10"
ecn = false
df = "set"
tfc_pad_to = 300
  [sa.encap]
  src_port = 4500
  dst_port = 4500
  [[sa.selector]]
  src = "198.18.1.0/24"
  dst = "198.18.2.0/24"
  proto = "tcp"
  dst_ports = "80-443"
  [sa.soft]
  bytes = "512M"
  add_time = "50m"
  [sa.hard]
  bytes = "1G"
  packets = 1000000
  add_time = "1h"
  use_time = "600"

[[sa]]
spi = 0x2001
dir = "in"
src = "2001:db8::2"
dst = "2001:db8::1"
suite = "aes256-sha256"
enc_key = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
integ_key = "00:11:22:33:44:55:66:77:88:99:aa:bb:cc:dd:ee:ff:00:11:22:33:44:55:66:77:88:99:aa:bb:cc:dd:ee:ff"
reqid = 1

[[policy]]
src = "198.18.1.0/24"
dst = "198.18.2.0/24"
dir = "out"
reqid = 1
priority = 100

[[policy]]
src = "198.18.1.7"
dst = "0.0.0.0/0"
dir = "out"
action = "bypass"
`

func TestParseSample(t *testing.T) {
	f, err := Parse("gw.toml", []byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(f.SAs) != 2 || len(f.Policies) != 2 {
		t.Fatalf("got %d SAs and %d policies, want 2 and 2", len(f.SAs), len(f.Policies))
	}
	out := f.SAs[0]
	want := crypto.Suite{Encryption: crypto.EncrAESGCM16, KeyBits: 128, ESN: true}
	if out.Suite != want {
		t.Errorf("suite = %+v, want %+v", out.Suite, want)
	}
	if out.SPI != 0x1001 || out.Dir != sa.DirOut || out.Src != netip.MustParseAddr("198.18.0.1") ||
		out.ReqID != 1 || out.ReplayWindow != 64 || out.TTL != 32 || out.CopyDSCP || out.DSCP != 10 ||
		out.ECN || out.DF != esp.DFSet || out.TFCPadTo != 300 || out.EncapSrcPort != 4500 || out.EncapDstPort != 4500 {
		t.Errorf("out SA fields wrong: %+v", out)
	}
	if len(out.EncKey) != 20 || out.EncKey[19] != 0x13 || out.IntegKey != nil {
		t.Errorf("keys wrong: enc %d bytes, integ %d bytes", len(out.EncKey), len(out.IntegKey))
	}
	sel := out.Selectors[0]
	if sel.Src != netip.MustParsePrefix("198.18.1.0/24") || sel.Proto != 6 || sel.DstPorts != (sa.PortRange{Lo: 80, Hi: 443}) || !sel.SrcPorts.Any() {
		t.Errorf("selector = %+v", sel)
	}
	if out.Soft.Bytes != 512<<20 || out.Soft.AddTime != 50*time.Minute || out.Hard.Bytes != 1<<30 ||
		out.Hard.Packets != 1000000 || out.Hard.AddTime != time.Hour || out.Hard.UseTime != 10*time.Minute {
		t.Errorf("lifetimes: soft %+v hard %+v", out.Soft, out.Hard)
	}
	in := f.SAs[1]
	if in.Dir != sa.DirIn || !in.Dst.Is6() || len(in.IntegKey) != 32 || in.ReplayWindow != sa.DefaultReplayWindow || !in.ECN || !in.CopyDSCP {
		t.Errorf("in SA fields wrong: %+v", in)
	}
	p := f.Policies[1]
	if p.Action != sa.ActionBypass || p.Src != netip.MustParsePrefix("198.18.1.7/32") || p.Dst.Bits() != 0 {
		t.Errorf("bypass policy = %+v", p)
	}
	if f.Policies[0].Action != sa.ActionProtect || f.Policies[0].Priority != 100 {
		t.Errorf("protect policy = %+v", f.Policies[0])
	}
}

// TestParseErrors checks that every invalid file is refused with the line the
// problem is on and a reason, and that errors never quote a key.
func TestParseErrors(t *testing.T) {
	const key = "0x000102030405060708090a0b0c0d0e0f10111213"
	base := func(extra string) string {
		return "\n[[sa]]\nspi = 0x1001\ndir = \"out\"\nsrc = \"198.18.0.1\"\ndst = \"198.18.0.2\"\nsuite = \"aes128gcm16\"\nenc_key = \"" +
			key[:len(key)-2] + "\"\nreqid = 1\n" + extra
	}
	good := func(extra string) string {
		return "\n[[sa]]\nspi = 0x1001\ndir = \"in\"\nsrc = \"198.18.0.1\"\ndst = \"198.18.0.2\"\nsuite = \"aes128gcm16\"\nenc_key = \"" +
			key + "\"\nreqid = 1\n" + extra
	}
	cases := []struct {
		name, text string
		line       int
		reason     string
	}{
		{"syntax", "[[sa]]\nspi = = 3\n", 2, ""},
		{"unknown key", "[[sa]]\nspi = 0x1001\ncolour = \"red\"\n", 3, "unknown key"},
		{"short key", base(""), 2, "enc_key is 19 bytes; the suite needs 20"},
		{"unknown top-level key", "x = 1\n[[sa]]\nsuite = \"3des-md5\"\nspi = 300\ndir = \"in\"\nsrc = \"198.18.0.1\"\ndst = \"198.18.0.2\"\n", 0, "unknown key"},
		{"refused suite", "[[sa]]\nsuite = \"3des-md5\"\nspi = 300\ndir = \"in\"\nsrc = \"198.18.0.1\"\ndst = \"198.18.0.2\"\n", 1, "3des"},
		{"small spi", "[[sa]]\nspi = 3\ndir = \"out\"\nsrc = \"198.18.0.1\"\ndst = \"198.18.0.2\"\nsuite = \"aes128gcm16\"\nenc_key = \"" + key + "\"\n", 1, "SPI 3 is reserved"},
		{"spi 255", "\n[[sa]]\nspi = 255\ndir = \"in\"\nsrc = \"198.18.0.1\"\ndst = \"198.18.0.2\"\nsuite = \"aes128gcm16\"\nenc_key = \"" + key + "\"\n", 2, "RFC 4303"},
		{"spi 0", "[[sa]]\nspi = 0\ndir = \"in\"\nsrc = \"198.18.0.1\"\ndst = \"198.18.0.2\"\nsuite = \"aes128gcm16\"\nenc_key = \"" + key + "\"\n", 1, "reserved"},
		{"replay window too large", good("replay_window = 65537\n"), 2, "replay window 65537 is above the maximum of 65536"},
		{"inline and file key", good("enc_key_file = \"k\"\n"), 2, "enc_key and enc_key_file are both given"},
		{"missing key file", "[[sa]]\nspi = 300\ndir = \"in\"\nsrc = \"198.18.0.1\"\ndst = \"198.18.0.2\"\nsuite = \"aes128gcm16\"\nenc_key_file = \"/nonexistent/espd.key\"\n", 1, "enc_key_file: open /nonexistent/espd.key"},
		{"mixed families", "[[sa]]\nspi = 300\ndir = \"in\"\nsrc = \"198.18.0.1\"\ndst = \"2001:db8::1\"\n", 1, "different address families"},
		{"bad prefix", "[[policy]]\nsrc = \"198.18.1.1/24\"\ndst = \"0.0.0.0/0\"\ndir = \"out\"\nreqid = 1\n", 1, "host bits"},
		{"no reqid", "\n\n[[policy]]\nsrc = \"198.18.1.0/24\"\ndst = \"0.0.0.0/0\"\ndir = \"out\"\n", 3, "reqid"},
		{"bad ports", "[[policy]]\nsrc = \"198.18.1.0/24\"\ndst = \"0.0.0.0/0\"\ndir = \"out\"\nreqid = 1\ndst_ports = \"90-80\"\n", 1, "ends before"},
		{"duplicate policy", "[[policy]]\nsrc = \"198.18.1.0/24\"\ndst = \"0.0.0.0/0\"\ndir = \"out\"\nreqid = 1\n[[policy]]\nsrc = \"198.18.1.0/24\"\ndst = \"0.0.0.0/0\"\ndir = \"out\"\nreqid = 2\n", 6, "same selector"},
		{"bad lifetime", "[[sa]]\nspi = 300\ndir = \"in\"\nsrc = \"198.18.0.1\"\ndst = \"198.18.0.2\"\nsuite = \"aes128gcm16\"\nenc_key = \"" + key + "\"\n[sa.hard]\nbytes = \"lots\"\n", 1, "hard.bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("gw.toml", []byte(c.text))
			if err == nil {
				t.Fatal("invalid file accepted")
			}
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not a *config.Error", err)
			}
			if c.line != 0 && ce.Line != c.line {
				t.Errorf("line = %d, want %d (%v)", ce.Line, c.line, err)
			}
			if !strings.Contains(err.Error(), c.reason) {
				t.Errorf("error %q does not say %q", err, c.reason)
			}
			if !strings.HasPrefix(err.Error(), "gw.toml:") {
				t.Errorf("error %q does not name the file", err)
			}
			if strings.Contains(err.Error(), "0405060708") {
				t.Errorf("error %q quotes key material", err)
			}
		})
	}
}

func TestValues(t *testing.T) {
	if p, err := ParseProto("icmpv6"); err != nil || p != 58 {
		t.Errorf("icmpv6 = %d, %v", p, err)
	}
	if p, err := ParseProto("47"); err != nil || p != 47 {
		t.Errorf("47 = %d, %v", p, err)
	}
	if _, err := ParseProto("tcpp"); err == nil {
		t.Error("tcpp accepted")
	}
	if ProtoName(6) != "tcp" || ProtoName(200) != "200" {
		t.Errorf("ProtoName: %s %s", ProtoName(6), ProtoName(200))
	}
	for in, want := range map[string]uint64{"": 0, "1000": 1000, "4K": 4096, "2M": 2 << 20, "3kB": 3000, "1G": 1 << 30} {
		if got, err := ParseBytes("b", in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	if _, err := ParseBytes("b", "99999999999999999999T"); err == nil {
		t.Error("overflow accepted")
	}
	if d, err := ParseDuration("d", "90"); err != nil || d != 90*time.Second {
		t.Errorf("90 = %v, %v", d, err)
	}
	if _, err := ParseDuration("d", "-5s"); err == nil {
		t.Error("negative duration accepted")
	}
	if c, v, err := ParseDSCP("46"); err != nil || c || v != 46 {
		t.Errorf("dscp 46 = %v %d %v", c, v, err)
	}
	if _, _, err := ParseDSCP("64"); err == nil {
		t.Error("dscp 64 accepted")
	}
	if _, err := ParseKey("k", "0xzz", 1); err == nil || strings.Contains(err.Error(), "zz") {
		t.Errorf("bad hex: %v", err)
	}
	if _, err := ParseKey("k", "00", 0); err == nil {
		t.Error("key accepted for a suite without one")
	}
}
