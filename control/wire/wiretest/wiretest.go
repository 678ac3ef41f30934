// Package wiretest holds the sample states and policies that the tests of
// control and control/wire share. Only tests import it.
package wiretest

import (
	"bytes"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
	"github.com/espd/espd/sa"
)

// Addresses of the sample states.
var (
	V4A = netip.MustParseAddr("198.18.0.1")
	V4B = netip.MustParseAddr("198.18.0.2")
	V6A = netip.MustParseAddr("2001:db8::1")
	V6B = netip.MustParseAddr("2001:db8::2")
)

// MustSuite parses a suite name or fails the test.
func MustSuite(t testing.TB, name string) crypto.Suite {
	t.Helper()
	s, err := crypto.ParseSuite(name)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Key is n bytes counting up from seed: a test key.
func Key(n int, seed byte) []byte {
	k := make([]byte, n)
	for i := range k {
		k[i] = seed + byte(i)
	}
	return k
}

// FullConfig sets every field of a state to a non-zero value.
func FullConfig(t testing.TB) sa.Config {
	s := MustSuite(t, "aes256-sha384-esn")
	return sa.Config{
		SPI: 0xC0010203, Dir: sa.DirOut, Src: V4A, Dst: V4B, Suite: s,
		EncKey: Key(s.EncKeyLen(), 1), IntegKey: Key(s.IntegKeyLen(), 100),
		ReplayWindow: 128, EncapSrcPort: 4500, EncapDstPort: 4501, ReqID: 7, IfID: 42,
		Selectors: []sa.Selector{
			{Src: netip.MustParsePrefix("198.18.1.0/24"), Dst: netip.MustParsePrefix("198.19.0.0/16"),
				Proto: 6, SrcPorts: sa.PortRange{Lo: 1024, Hi: 65535}, DstPorts: sa.PortRange{Lo: 443, Hi: 443}},
			{Src: netip.MustParsePrefix("2001:db8:1::/48"), Dst: netip.MustParsePrefix("2001:db8:2::/64")},
			{},
		},
		Soft: sa.Lifetime{Bytes: 1 << 30, Packets: 1 << 20, AddTime: 50 * time.Minute, UseTime: 20 * time.Minute},
		Hard: sa.Lifetime{Bytes: 2 << 30, Packets: 2 << 20, AddTime: time.Hour, UseTime: 30*time.Minute + 1},
		TTL:  33, CopyDSCP: true, DSCP: 46, ECN: true, DF: esp.DFClear, TFCPadTo: 1400,
	}
}

// GCMConfig is a small inbound IPv6 state.
func GCMConfig(t testing.TB, spi uint32) sa.Config {
	s := MustSuite(t, "aes128gcm16")
	return sa.Config{SPI: spi, Dir: sa.DirIn, Src: V6A, Dst: V6B, Suite: s,
		EncKey: Key(s.EncKeyLen(), 9), ReplayWindow: 64, ReqID: 2}
}

// OSeqConfig is an outbound ESN state with the largest oseq it can take.
func OSeqConfig(t testing.TB) sa.Config {
	c := FullConfig(t)
	c.SPI = 0xC0010204
	c.OSeq = 1<<64 - 2
	return c
}

// ReplayConfig is an inbound ESN state given a replay state.
func ReplayConfig(t testing.TB) sa.Config {
	c := GCMConfig(t, 0x1235)
	c.Suite.ESN = true
	c.ReplaySeq = 1<<64 - 1
	c.ReplayBitmap = []byte{0x05, 0, 0, 0, 0, 0, 0, 0x80}
	return c
}

// TransportConfig is an outbound transport-mode state between the two
// IPv4 hosts, without TFC padding (transport mode takes none).
func TransportConfig(t testing.TB, spi uint32) sa.Config {
	s := MustSuite(t, "aes256gcm16")
	return sa.Config{SPI: spi, Dir: sa.DirOut, Src: V4A, Dst: V4B, Mode: sa.ModeTransport, Suite: s,
		EncKey: Key(s.EncKeyLen(), 30), ReplayWindow: 32, ReqID: 8,
		Selectors: []sa.Selector{{Src: netip.PrefixFrom(V4A, 32), Dst: netip.PrefixFrom(V4B, 32), Proto: 17}},
		TTL:       64, ECN: true, DF: esp.DFCopy, CopyDSCP: true}
}

// TransportPolicy is an outbound protect policy whose template asks for
// transport-mode states.
func TransportPolicy() sa.Policy {
	return sa.Policy{
		Selector: sa.Selector{Src: netip.PrefixFrom(V4A, 32), Dst: netip.PrefixFrom(V4B, 32), Proto: 17},
		Dir:      sa.DirOut, Action: sa.ActionProtect, Priority: 10, ReqID: 8, Index: 0x201,
		TmplSrc: V4A, TmplDst: V4B, Mode: sa.ModeTransport,
	}
}

// FullPolicy sets every field of a policy to a non-zero value.
func FullPolicy() sa.Policy {
	return sa.Policy{
		Selector: sa.Selector{Src: netip.MustParsePrefix("198.18.1.0/24"), Dst: netip.MustParsePrefix("198.19.0.0/16"),
			Proto: 17, SrcPorts: sa.PortRange{Lo: 5000, Hi: 5010}, DstPorts: sa.PortRange{Lo: 53, Hi: 53}},
		Dir: sa.DirFwd, Action: sa.ActionDrop, Priority: 99, ReqID: 5, Index: 0x102,
		TmplSrc: V4A, TmplDst: V4B, IfID: 42,
	}
}

// SameConfig compares configurations, keys included, treating nil and
// empty keys alike.
func SameConfig(a, b sa.Config) bool {
	if !bytes.Equal(a.EncKey, b.EncKey) || !bytes.Equal(a.IntegKey, b.IntegKey) {
		return false
	}
	a.EncKey, a.IntegKey, b.EncKey, b.IntegKey = nil, nil, nil, nil
	if len(a.Selectors) == 0 && len(b.Selectors) == 0 {
		a.Selectors, b.Selectors = nil, nil
	}
	if !slices.Equal(a.Selectors, b.Selectors) {
		return false
	}
	a.Selectors, b.Selectors = nil, nil
	return a.SPI == b.SPI && a.Dir == b.Dir && a.Src == b.Src && a.Dst == b.Dst && a.Mode == b.Mode && a.Suite == b.Suite &&
		a.ReplayWindow == b.ReplayWindow && a.EncapSrcPort == b.EncapSrcPort && a.EncapDstPort == b.EncapDstPort &&
		a.ReqID == b.ReqID && a.IfID == b.IfID && a.Soft == b.Soft && a.Hard == b.Hard && a.TTL == b.TTL &&
		a.CopyDSCP == b.CopyDSCP && a.DSCP == b.DSCP && a.ECN == b.ECN && a.DF == b.DF && a.TFCPadTo == b.TFCPadTo &&
		a.OSeq == b.OSeq && a.ReplaySeq == b.ReplaySeq && bytes.Equal(a.ReplayBitmap, b.ReplayBitmap) && a.Negotiated == b.Negotiated
}
