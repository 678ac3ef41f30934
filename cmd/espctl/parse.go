package main

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

// parseSPI parses an SPI in hex (0x prefix) or decimal.
func parseSPI(s string) (uint32, error) {
	v, err := strconv.ParseUint(s, 0, 32)
	if err != nil {
		return 0, fmt.Errorf("SPI %q: want a 32-bit number such as 0xc0000001 or 3221225473", s)
	}
	return uint32(v), nil
}

// parseU32 parses a decimal or 0x-prefixed 32-bit number.
func parseU32(what, s string) (uint32, error) {
	v, err := strconv.ParseUint(s, 0, 32)
	if err != nil {
		return 0, fmt.Errorf("%s %q: want a number from 0 to 4294967295", what, s)
	}
	return uint32(v), nil
}

// parseUint parses a number from 0 to max.
func parseUint(what, s string, max uint64) (uint64, error) {
	v, err := strconv.ParseUint(s, 0, 64)
	if err != nil || v > max {
		return 0, fmt.Errorf("%s %q: want a number from 0 to %d", what, s, max)
	}
	return v, nil
}

// parseKey parses key material in hex, with an optional 0x prefix.
func parseKey(what, s string) ([]byte, error) {
	h := strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X")
	if len(h)%2 != 0 {
		return nil, fmt.Errorf("%s: odd number of hex digits (%d)", what, len(h))
	}
	k, err := hex.DecodeString(h)
	if err != nil {
		return nil, fmt.Errorf("%s: not hex: %v", what, err)
	}
	return k, nil
}

// parseAddr parses an IP address.
func parseAddr(what, s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%s %q: not an IP address", what, s)
	}
	return a.Unmap(), nil
}

// parsePrefix parses a prefix, a bare address (a host prefix) or "any".
func parsePrefix(what, s string) (netip.Prefix, error) {
	if s == "any" || s == "" {
		return netip.Prefix{}, nil
	}
	if !strings.Contains(s, "/") {
		a, err := parseAddr(what, s)
		if err != nil {
			return netip.Prefix{}, err
		}
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%s %q: not a prefix such as 198.18.0.0/15 or 2001:db8::/32", what, s)
	}
	return p.Masked(), nil
}

// parsePorts parses "80", "1024-65535" or "any".
func parsePorts(what, s string) (sa.PortRange, error) {
	if s == "any" || s == "" {
		return sa.PortRange{}, nil
	}
	lo, hi, isRange := strings.Cut(s, "-")
	l, err1 := strconv.ParseUint(lo, 10, 16)
	h := l
	var err2 error
	if isRange {
		h, err2 = strconv.ParseUint(hi, 10, 16)
	}
	if err1 != nil || err2 != nil || l > h {
		return sa.PortRange{}, fmt.Errorf("%s %q: want a port, a range such as 1024-65535, or any", what, s)
	}
	return sa.PortRange{Lo: uint16(l), Hi: uint16(h)}, nil
}

var protoNames = map[string]uint8{
	"icmp": 1, "igmp": 2, "tcp": 6, "udp": 17, "gre": 47, "esp": 50, "ah": 51,
	"icmpv6": 58, "ipv6-icmp": 58, "sctp": 132, "udplite": 136,
}

// parseProto parses an IP protocol by name or number; "any" is 0.
func parseProto(s string) (uint8, error) {
	if s == "any" || s == "" {
		return 0, nil
	}
	if p, ok := protoNames[strings.ToLower(s)]; ok {
		return p, nil
	}
	v, err := strconv.ParseUint(s, 10, 8)
	if err != nil {
		return 0, fmt.Errorf("protocol %q: want tcp, udp, icmp, icmpv6, sctp, a number 0-255 or any", s)
	}
	return uint8(v), nil
}

// protoName names an IP protocol.
func protoName(p uint8) string {
	switch p {
	case 0:
		return "any"
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 58:
		return "icmpv6"
	case 132:
		return "sctp"
	}
	return strconv.Itoa(int(p))
}

// parseDuration parses a Go duration ("90s", "1h30m") or plain seconds.
func parseDuration(what, s string) (time.Duration, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%s %q: want a duration such as 3600, 90s or 1h30m", what, s)
	}
	return d, nil
}

// parseStateDir parses the direction of a state: in or out.
func parseStateDir(s string) (sa.Direction, error) {
	d, err := sa.ParseDirection(s)
	if err != nil || d == sa.DirFwd {
		return 0, fmt.Errorf("dir %q: a state is in or out", s)
	}
	return d, nil
}

// parsePolicyDir parses the direction of a policy: in, out or fwd.
func parsePolicyDir(s string) (sa.Direction, error) {
	d, err := sa.ParseDirection(s)
	if err != nil {
		return 0, fmt.Errorf("dir %q: a policy is in, out or fwd", s)
	}
	return d, nil
}

// parseDF parses copy, set or clear.
func parseDF(s string) (esp.DFMode, error) {
	switch s {
	case "copy":
		return esp.DFCopy, nil
	case "set":
		return esp.DFSet, nil
	case "clear":
		return esp.DFClear, nil
	}
	return 0, fmt.Errorf("df %q: want copy, set or clear", s)
}

// parseDSCP parses a DSCP value 0-63 or "copy".
func parseDSCP(s string) (dscp uint8, copyInner bool, err error) {
	if s == "copy" {
		return 0, true, nil
	}
	v, err := strconv.ParseUint(s, 0, 8)
	if err != nil || v > 63 {
		return 0, false, fmt.Errorf("dscp %q: want 0-63 or copy", s)
	}
	return uint8(v), false, nil
}

// parseBool parses a boolean flag value.
func parseBool(what, s string) (bool, error) {
	switch strings.ToLower(s) {
	case "1", "true", "yes", "on":
		return true, nil
	case "0", "false", "no", "off":
		return false, nil
	}
	return false, fmt.Errorf("%s %q: want on or off", what, s)
}

// parseSelector parses "src=PREFIX,dst=PREFIX,proto=P,sport=R,dport=R"
// (every key optional).
func parseSelector(s string) (sa.Selector, error) {
	var sel sa.Selector
	if s == "" || s == "any" {
		return sel, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return sa.Selector{}, fmt.Errorf("selector %q: %q is not key=value (keys: src, dst, proto, sport, dport)", s, kv)
		}
		var err error
		switch k {
		case "src":
			sel.Src, err = parsePrefix("selector src", v)
		case "dst":
			sel.Dst, err = parsePrefix("selector dst", v)
		case "proto":
			sel.Proto, err = parseProto(v)
		case "sport":
			sel.SrcPorts, err = parsePorts("selector sport", v)
		case "dport":
			sel.DstPorts, err = parsePorts("selector dport", v)
		default:
			err = fmt.Errorf("selector %q: unknown key %q (keys: src, dst, proto, sport, dport)", s, k)
		}
		if err != nil {
			return sa.Selector{}, err
		}
	}
	if err := sel.Validate(); err != nil {
		return sa.Selector{}, err
	}
	return sel, nil
}
