package sa

import (
	"net/netip"
	"testing"

	"github.com/espd/espd/packet"
)

func flow(src, dst string, proto uint8, sport, dport uint16) packet.Flow {
	return packet.Flow{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Proto: proto, SrcPort: sport, DstPort: dport}
}

func pfx(s string) netip.Prefix { return netip.MustParsePrefix(s) }

func TestSelectorMatch(t *testing.T) {
	tcp80 := Selector{Src: pfx("198.18.0.0/24"), Dst: pfx("198.19.0.0/16"), Proto: 6, DstPorts: PortRange{80, 80}}
	cases := []struct {
		name string
		sel  Selector
		f    packet.Flow
		want bool
	}{
		{"zero selector matches v4", Selector{}, flow("198.18.0.1", "198.19.0.1", 17, 1, 2), true},
		{"zero selector matches v6", Selector{}, flow("2001:db8::1", "2001:db8::2", 6, 1, 2), true},
		{"tcp80 hit", tcp80, flow("198.18.0.9", "198.19.7.7", 6, 40000, 80), true},
		{"tcp80 wrong port", tcp80, flow("198.18.0.9", "198.19.7.7", 6, 40000, 81), false},
		{"tcp80 wrong proto", tcp80, flow("198.18.0.9", "198.19.7.7", 17, 40000, 80), false},
		{"tcp80 src outside", tcp80, flow("198.18.1.9", "198.19.7.7", 6, 40000, 80), false},
		{"tcp80 dst outside", tcp80, flow("198.18.0.9", "198.20.7.7", 6, 40000, 80), false},
		{"v4 prefix never holds v6", Selector{Src: pfx("0.0.0.0/0")}, flow("2001:db8::1", "2001:db8::2", 6, 1, 2), false},
		{"v6 prefix", Selector{Dst: pfx("2001:db8:1::/48")}, flow("2001:db8::1", "2001:db8:1:2::3", 58, 128, 0), true},
		{"icmp type as sport", Selector{Proto: 1, SrcPorts: PortRange{8, 8}}, flow("198.18.0.1", "198.18.0.2", 1, 8, 0), true},
		{"icmp other type", Selector{Proto: 1, SrcPorts: PortRange{8, 8}}, flow("198.18.0.1", "198.18.0.2", 1, 0, 0), false},
		{"port range low end", Selector{SrcPorts: PortRange{1024, 65535}}, flow("198.18.0.1", "198.18.0.2", 6, 1024, 1), true},
		{"port range below", Selector{SrcPorts: PortRange{1024, 65535}}, flow("198.18.0.1", "198.18.0.2", 6, 1023, 1), false},
		{"host bits ignored", Selector{Src: pfx("198.18.0.77/24")}, flow("198.18.0.1", "198.18.0.2", 6, 1, 1), true},
	}
	for _, c := range cases {
		if got := c.sel.Match(c.f); got != c.want {
			t.Errorf("%s: %v.Match(%+v) = %v, want %v", c.name, c.sel, c.f, got, c.want)
		}
	}
}

func TestSelectorValidate(t *testing.T) {
	bad := []Selector{
		{Src: pfx("198.18.0.0/24"), Dst: pfx("2001:db8::/32")},
		{SrcPorts: PortRange{10, 9}},
		{DstPorts: PortRange{1, 0}},
	}
	for _, s := range bad {
		if err := s.Validate(); err == nil {
			t.Errorf("%v: Validate accepted it", s)
		}
	}
	good := []Selector{{}, {Src: pfx("198.18.0.0/24")}, {Dst: pfx("2001:db8::/32"), Proto: 17, DstPorts: PortRange{4500, 4500}}}
	for _, s := range good {
		if err := s.Validate(); err != nil {
			t.Errorf("%v: %v", s, err)
		}
	}
}

func TestSelectorString(t *testing.T) {
	s := Selector{Src: pfx("198.18.0.0/24"), Proto: 6, SrcPorts: PortRange{1024, 65535}, DstPorts: PortRange{80, 80}}
	want := "src 198.18.0.0/24 dst any proto 6 sport 1024-65535 dport 80"
	if got := s.String(); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

func TestDirectionActionNames(t *testing.T) {
	for d := range numDirections {
		got, err := ParseDirection(d.String())
		if err != nil || got != d {
			t.Errorf("ParseDirection(%q) = %v, %v", d.String(), got, err)
		}
	}
	for a := range numActions {
		got, err := ParseAction(a.String())
		if err != nil || got != a {
			t.Errorf("ParseAction(%q) = %v, %v", a.String(), got, err)
		}
	}
	if _, err := ParseDirection("sideways"); err == nil {
		t.Error("ParseDirection accepted sideways")
	}
	if _, err := ParseAction("maybe"); err == nil {
		t.Error("ParseAction accepted maybe")
	}
}
