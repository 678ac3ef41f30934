package main

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/espd/espd/config"
	"github.com/espd/espd/sa"
)

// The values shared with the configuration file are parsed by package
// config, so that espctl and the file accept exactly the same syntax.
var (
	parseAddr     = config.ParseAddr
	parsePorts    = config.ParsePortRange
	parseProto    = config.ParseProto
	protoName     = config.ProtoName
	parseDuration = config.ParseDuration
	parseSeq      = config.ParseSeq
	parseHexBytes = config.ParseHexBytes
	parseDF       = config.ParseDF
	parseDSCP     = config.ParseDSCP
	parseMode     = config.ParseMode
)

// parsePrefix parses a selector prefix; "any" or "" is the zero prefix
// (any address).
func parsePrefix(what, s string) (netip.Prefix, error) {
	if s == "any" || s == "" {
		return netip.Prefix{}, nil
	}
	return config.ParsePrefix(what, s)
}

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
