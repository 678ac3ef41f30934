package config

import (
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// routeBased is a route-based tunnel: two interfaces, an SA pair and a
// policy pair on interface 42, and the same selector once more on espd's
// own TUN (if_id 0), which is another policy.
const routeBased = `[[interface]]
name = "ipsec42"
if_id = 42
mtu = 1400

[[interface]]
name = "ipsec-x"
if_id = 4294967295

[[sa]]
spi = 0x1001
dir = "out"
src = "198.18.0.1"
dst = "198.18.0.2"
suite = "aes128gcm16"
enc_key = "` + gcmKeyHex + `"
reqid = 1
if_id = 42

[[sa]]
spi = 0x2001
dir = "in"
src = "198.18.0.2"
dst = "198.18.0.1"
suite = "aes128gcm16"
enc_key = "` + gcmKeyHex + `"
reqid = 1
if_id = 42

[[sa]]
spi = 0x3001
dir = "out"
src = "198.18.0.1"
dst = "198.18.0.3"
suite = "aes128gcm16"
enc_key = "` + gcmKeyHex + `"
reqid = 2

[[policy]]
src = "0.0.0.0/0"
dst = "0.0.0.0/0"
dir = "out"
reqid = 1
if_id = 42

[[policy]]
src = "0.0.0.0/0"
dst = "0.0.0.0/0"
dir = "in"
reqid = 1
if_id = 42

[[policy]]
src = "0.0.0.0/0"
dst = "0.0.0.0/0"
dir = "out"
reqid = 2
`

func TestParseInterfaces(t *testing.T) {
	f, err := Parse("gw.toml", []byte(routeBased))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Wipe()
	want := []Interface{{Name: "ipsec42", IfID: 42, MTU: 1400}, {Name: "ipsec-x", IfID: 1<<32 - 1}}
	if !reflect.DeepEqual(f.Interfaces, want) {
		t.Errorf("interfaces = %+v, want %+v", f.Interfaces, want)
	}
	for i, w := range []uint32{42, 42, 0} {
		if f.SAs[i].IfID != w {
			t.Errorf("sa #%d: if_id %d, want %d", i+1, f.SAs[i].IfID, w)
		}
		if f.Policies[i].IfID != w {
			t.Errorf("policy #%d: if_id %d, want %d", i+1, f.Policies[i].IfID, w)
		}
	}
	// The same selector and direction on two interfaces are two policies.
	if f.Policies[0].ID() == f.Policies[2].ID() || f.Policies[0].Selector != f.Policies[2].Selector {
		t.Errorf("policies #1 and #3: %v and %v", f.Policies[0], f.Policies[2])
	}

	// No [[interface]], no if_id: nothing route-based.
	f, err = Parse("gw.toml", []byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Wipe()
	if f.Interfaces != nil {
		t.Errorf("interfaces = %+v, want none", f.Interfaces)
	}
	for _, c := range f.SAs {
		if c.IfID != 0 {
			t.Errorf("sa spi 0x%x: if_id %d, want 0", c.SPI, c.IfID)
		}
	}
	for _, p := range f.Policies {
		if p.IfID != 0 {
			t.Errorf("policy %v: if_id %d, want 0", p, p.IfID)
		}
	}

	// mtu's bounds, and an [[interface]] alone.
	for _, mtu := range []int{0, 576, 65535} {
		text := "[[interface]]\nname = \"ipsec1\"\nif_id = 1\nmtu = " + strconv.Itoa(mtu) + "\n"
		f, err := Parse("gw.toml", []byte(text))
		if err != nil {
			t.Fatalf("mtu %d: %v", mtu, err)
		}
		if len(f.Interfaces) != 1 || f.Interfaces[0].MTU != mtu || len(f.SAs) != 0 || len(f.Policies) != 0 {
			t.Errorf("mtu %d: %+v", mtu, f)
		}
	}
}

// TestParseInterfaceErrors: each refusal names the file, the line of the
// table at fault and the reason; SAs and policies take if_id as they take
// reqid.
func TestParseInterfaceErrors(t *testing.T) {
	ifc := func(body string) string { return "[[interface]]\n" + body }
	pol := func(extra string) string {
		return "[[policy]]\nsrc = \"198.18.1.0/24\"\ndst = \"0.0.0.0/0\"\ndir = \"out\"\nreqid = 1\n" + extra
	}
	cases := []struct {
		name, text string
		line       int
		reason     string
	}{
		{"no name", ifc("if_id = 1\n"), 1, "interface #1: name is required"},
		{"empty name", ifc("name = \"\"\nif_id = 1\n"), 1, "interface #1: name is required"},
		{"long name", ifc("name = \"ipsec-0123456789\"\nif_id = 1\n"), 1, `name "ipsec-0123456789" is 16 bytes; a Linux interface name has at most 15`},
		{"slash", ifc("name = \"ipsec/1\"\nif_id = 1\n"), 1, `cannot hold '/'`},
		{"colon", ifc("name = \"ipsec:1\"\nif_id = 1\n"), 1, `cannot hold ':'`},
		{"pattern", ifc("name = \"ipsec%d\"\nif_id = 1\n"), 1, `cannot hold '%'`},
		{"space", ifc("name = \"ipsec 1\"\nif_id = 1\n"), 1, "cannot hold whitespace"},
		{"tab", ifc("name = \"ipsec\\t1\"\nif_id = 1\n"), 1, "cannot hold whitespace"},
		{"nul", ifc("name = \"ipsec\\u00001\"\nif_id = 1\n"), 1, "control characters"},
		{"no-break space", ifc("name = \"ipsec\u00e0\"\nif_id = 1\n"), 1, "byte 0xa0"},
		{"dot", ifc("name = \".\"\nif_id = 1\n"), 1, `name "." is not a valid interface name`},
		{"dot dot", ifc("name = \"..\"\nif_id = 1\n"), 1, `name ".." is not a valid interface name`},
		{"no if_id", "\n" + ifc("name = \"ipsec1\"\n"), 2, "interface #1: if_id is required (1 to 4294967295)"},
		{"if_id 0", ifc("name = \"ipsec1\"\nif_id = 0\n"), 1, "interface #1: if_id 0 is espd's own policy-based TUN"},
		{"if_id negative", ifc("name = \"ipsec1\"\nif_id = -1\n"), 3, "out of range for uint32"},
		{"if_id too large", ifc("name = \"ipsec1\"\nif_id = 4294967296\n"), 3, "out of range for uint32"},
		{"if_id string", ifc("name = \"ipsec1\"\nif_id = \"1\"\n"), 0, "incompatible types"},
		{"mtu small", ifc("name = \"ipsec1\"\nif_id = 1\nmtu = 575\n"), 1, "mtu 575 is out of range 576-65535"},
		{"mtu large", ifc("name = \"ipsec1\"\nif_id = 1\nmtu = 65536\n"), 1, "mtu 65536 is out of range 576-65535"},
		{"mtu negative", ifc("name = \"ipsec1\"\nif_id = 1\nmtu = -1500\n"), 1, "mtu -1500 is out of range"},
		{"unknown key", ifc("name = \"ipsec1\"\nif_id = 1\nmode = \"tun\"\n"), 4, "unknown key interface.mode"},
		{"same name", ifc("name = \"ipsec1\"\nif_id = 1\n") + "\n" + ifc("name = \"ipsec1\"\nif_id = 2\n"), 5, `interface #2: name "ipsec1" is already interface #1`},
		{"same if_id", ifc("name = \"ipsec1\"\nif_id = 7\n") + ifc("name = \"ipsec2\"\nif_id = 8\n") + ifc("name = \"ipsec3\"\nif_id = 7\n"), 7, "interface #3: if_id 7 is already interface #1 (ipsec1)"},
		{"second table's line", ifc("name = \"ipsec1\"\nif_id = 1\n") + ifc("name = \"\"\nif_id = 2\n"), 4, "interface #2: name is required"},
		{"policy if_id too large", pol("if_id = 4294967296\n"), 6, "policy.if_id: 4294967296 is out of range for uint32"},
		{"policy if_id negative", pol("if_id = -1\n"), 6, "policy.if_id: -1 is out of range for uint32"},
		{"sa if_id negative", seqSA("out", "aes128gcm16", "if_id = -42\n"), 10, "sa.if_id: -42 is out of range for uint32"},
		{"duplicate policy on one interface", pol("if_id = 9\n") + pol("if_id = 9\n"), 7, "policy #2: same selector, direction and if_id (9) as policy #1"},
		{"duplicate policy on espd's TUN", pol("if_id = 9\n") + pol("") + pol("if_id = 0\n"), 12, "policy #3: same selector and direction as policy #2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f, err := Parse("gw.toml", []byte(c.text))
			if err == nil {
				t.Fatalf("invalid file accepted: %+v", f)
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
		})
	}
}

// TestCheckInterfaceName: the names the kernel takes pass, whatever espd's
// own TUN is called (the daemon, not the file, knows that).
func TestCheckInterfaceName(t *testing.T) {
	for _, name := range []string{"a", "ipsec0", "ipsec-x", "xfrm-42", "vti_lan.7", "ipsec0123456789", "tun\u00e9", "..."} {
		if err := CheckInterfaceName(name); err != nil {
			t.Errorf("%q: %v", name, err)
		}
	}
	for _, name := range []string{"", ".", "..", "a/b", "a:b", "a%d", "a b", "a\nb", "a\x7fb", "a\u00a0", "0123456789abcdef"} {
		if err := CheckInterfaceName(name); err == nil {
			t.Errorf("%q accepted", name)
		}
	}
}

// TestInterfaceNameNotTUN: a name equal to that of espd's policy-based TUN
// (tun.DefaultName, esp0, or espd --tun) is the daemon's to refuse, not the
// file's: only the daemon knows which name its TUN has.
func TestInterfaceNameNotTUN(t *testing.T) {
	f, err := Parse("gw.toml", []byte("[[interface]]\nname = \"esp0\"\nif_id = 1\n"))
	if err != nil || len(f.Interfaces) != 1 || f.Interfaces[0] != (Interface{Name: "esp0", IfID: 1}) {
		t.Errorf("%+v, %v", f, err)
	}
}
