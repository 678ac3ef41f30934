package config

import (
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/espd/espd/esp"
	"github.com/espd/espd/sa"
)

// The parsers below read values the way the config file and espctl's command
// line write them, so that both accept exactly the same syntax.

// ParseAddr parses a required IPv4 or IPv6 address; name is the field name
// used in the error.
func ParseAddr(name, s string) (netip.Addr, error) {
	if s == "" {
		return netip.Addr{}, fmt.Errorf("%s is required (an IPv4 or IPv6 address)", name)
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%s %q is not an IP address", name, s)
	}
	if a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%s %q: zoned addresses are not supported", name, s)
	}
	return a.Unmap(), nil
}

// ParsePrefix parses a prefix ("198.18.1.0/24", "2001:db8::/32"); a bare
// address means a host prefix. name is the field name used in the error.
func ParsePrefix(name, s string) (netip.Prefix, error) {
	if s == "" {
		return netip.Prefix{}, fmt.Errorf("%s is required (a prefix such as 198.18.1.0/24 or ::/0)", name)
	}
	if !strings.Contains(s, "/") {
		a, err := ParseAddr(name, s)
		if err != nil {
			return netip.Prefix{}, err
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%s %q is not a prefix", name, s)
	}
	if p != p.Masked() {
		return netip.Prefix{}, fmt.Errorf("%s %q has host bits set (did you mean %s?)", name, s, p.Masked())
	}
	return p, nil
}

// protocols are the protocol names selectors accept.
var protocols = map[string]uint8{
	"any": 0, "icmp": 1, "igmp": 2, "ipip": 4, "tcp": 6, "udp": 17, "ipv6": 41,
	"gre": 47, "esp": 50, "ah": 51, "icmpv6": 58, "ipv6-icmp": 58, "sctp": 132, "udplite": 136,
}

// ParseProto parses an IP protocol by name (tcp, udp, icmp, icmpv6, ...) or
// number; "" and "any" mean any protocol (0).
func ParseProto(s string) (uint8, error) {
	if s == "" {
		return 0, nil
	}
	if p, ok := protocols[strings.ToLower(s)]; ok {
		return p, nil
	}
	n, err := strconv.ParseUint(s, 0, 8)
	if err != nil {
		return 0, fmt.Errorf("proto %q is neither a protocol name (tcp, udp, icmp, icmpv6, sctp, ...) nor a number 0-255", s)
	}
	return uint8(n), nil
}

// ProtoName returns the name ParseProto accepts for p, or its number.
func ProtoName(p uint8) string {
	best := ""
	for n, v := range protocols {
		if v == p && (best == "" || len(n) < len(best)) {
			best = n
		}
	}
	if best == "" {
		return strconv.Itoa(int(p))
	}
	return best
}

// ParsePortRange parses "", "any", "443" or "1024-65535".
func ParsePortRange(name, s string) (sa.PortRange, error) {
	if s == "" || s == "any" {
		return sa.PortRange{}, nil
	}
	lo, hi, isRange := strings.Cut(s, "-")
	l, err := strconv.ParseUint(strings.TrimSpace(lo), 10, 16)
	if err != nil {
		return sa.PortRange{}, fmt.Errorf("%s %q: want a port or a range such as 1024-65535", name, s)
	}
	h := l
	if isRange {
		if h, err = strconv.ParseUint(strings.TrimSpace(hi), 10, 16); err != nil {
			return sa.PortRange{}, fmt.Errorf("%s %q: want a port or a range such as 1024-65535", name, s)
		}
	}
	if h < l {
		return sa.PortRange{}, fmt.Errorf("%s %q: the range ends before it starts", name, s)
	}
	return sa.PortRange{Lo: uint16(l), Hi: uint16(h)}, nil
}

// ParseKey parses hex key material written inline (an optional 0x prefix,
// optional ':' separators and whitespace) and checks its length; want 0
// means no key is expected. Errors never repeat the key. It is
// ParseKeyBytes on a scratch copy of s that it zeroes (s itself, a string,
// cannot be).
func ParseKey(name, s string, want int) ([]byte, error) {
	b := []byte(s)
	defer clear(b)
	return ParseKeyBytes(name, b, want)
}

// ParseBytes parses a byte count with an optional K, M, G or T suffix
// (powers of 1024) or a kB/MB/GB suffix (powers of 1000); "" is 0.
func ParseBytes(name, s string) (uint64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	mult := uint64(1)
	num := s
	suffixes := []struct {
		s string
		m uint64
	}{{"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000}, {"TB", 1000 * 1000 * 1000 * 1000},
		{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1}}
	for _, suf := range suffixes {
		if strings.HasSuffix(strings.ToUpper(s), suf.s) {
			mult, num = suf.m, strings.TrimSpace(s[:len(s)-len(suf.s)])
			break
		}
	}
	n, err := strconv.ParseUint(num, 10, 64)
	if err != nil || (mult > 1 && n > ^uint64(0)/mult) {
		return 0, fmt.Errorf("%s %q: want a byte count such as 1048576, 512M or 2G", name, s)
	}
	return n * mult, nil
}

// ParseDuration parses a Go duration ("90s", "1h30m") or a number of
// seconds; "" is 0 (no limit).
func ParseDuration(name, s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%s %q: want a duration such as 3600, 90s or 1h", name, s)
	}
	return d, nil
}

// ParseDSCP parses the outer DSCP setting: "" or "copy" copies the inner
// packet's DSCP, a number 0-63 sets it.
func ParseDSCP(s string) (copyDSCP bool, dscp uint8, err error) {
	if s == "" || s == "copy" {
		return true, 0, nil
	}
	n, err := strconv.ParseUint(s, 0, 8)
	if err != nil || n > 63 {
		return false, 0, fmt.Errorf("dscp %q: want copy or a number 0-63", s)
	}
	return false, uint8(n), nil
}

// ParseDF parses the outer DF setting: "" or "copy", "set", "clear".
func ParseDF(s string) (esp.DFMode, error) {
	switch s {
	case "", "copy":
		return esp.DFCopy, nil
	case "set":
		return esp.DFSet, nil
	case "clear":
		return esp.DFClear, nil
	}
	return 0, fmt.Errorf("df %q: want copy, set or clear", s)
}

// ParseMode parses a state's or a policy template's mode: "tunnel" or
// "transport" (sa.Mode; the file's mode key, espctl's --mode).
func ParseMode(s string) (sa.Mode, error) {
	m, err := sa.ParseMode(s)
	if err != nil {
		return 0, fmt.Errorf("mode %q: want tunnel or transport", s)
	}
	return m, nil
}

// ParseSeq parses a sequence number: decimal or 0x hex, up to 2^64-1
// (oseq, replay-seq).
func ParseSeq(name, s string) (uint64, error) {
	v, err := strconv.ParseUint(strings.TrimSpace(s), 0, 64)
	if err != nil {
		return 0, fmt.Errorf("%s %q: want a sequence number from 0 to 2^64-1, decimal or 0x hex", name, s)
	}
	return v, nil
}

// ParseHexBytes parses hex digits (an optional 0x, an even number of
// digits) as bytes, the first two digits being byte 0 (replay-bitmap).
func ParseHexBytes(name, s string) ([]byte, error) {
	h := strings.TrimSpace(s)
	h = strings.TrimPrefix(strings.TrimPrefix(h, "0x"), "0X")
	b, err := hex.DecodeString(h)
	if err != nil || len(h) == 0 {
		return nil, fmt.Errorf("%s %q: want hex bytes such as 0x0500ff (byte 0 first)", name, s)
	}
	return b, nil
}

// MaxInterfaceName is the longest Linux network interface name, in bytes
// (IFNAMSIZ less the terminating NUL).
const MaxInterfaceName = 15

// CheckInterfaceName reports what makes name unusable as the name of a
// network interface espd creates, by the kernel's rules (dev_valid_name):
// 1 to 15 bytes, not "." or "..", no '/', ':' or whitespace (for the
// kernel, byte 0xa0 too: Latin-1's no-break space, found in UTF-8 "à").
// It also refuses control characters, which no tool prints legibly, and
// '%', which would have the kernel pick a name from a pattern ("ipsec%d")
// instead of the one the administrator wrote.
func CheckInterfaceName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("name is required (a Linux interface name such as ipsec1, at most %d bytes)", MaxInterfaceName)
	case len(name) > MaxInterfaceName:
		return fmt.Errorf("name %q is %d bytes; a Linux interface name has at most %d", name, len(name), MaxInterfaceName)
	case name == "." || name == "..":
		return fmt.Errorf("name %q is not a valid interface name", name)
	}
	for i := 0; i < len(name); i++ {
		switch ch := name[i]; {
		case ch <= ' ' || ch == 0x7f:
			return fmt.Errorf("name %q: an interface name cannot hold whitespace or control characters", name)
		case ch == 0xa0:
			return fmt.Errorf("name %q: an interface name cannot hold byte 0xa0, which the kernel takes for a space", name)
		case ch == '/' || ch == ':' || ch == '%':
			return fmt.Errorf("name %q: an interface name cannot hold %q", name, ch)
		}
	}
	return nil
}
