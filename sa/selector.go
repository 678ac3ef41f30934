package sa

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/espd/espd/packet"
)

// PortRange is an inclusive range of ports. The zero value matches any
// port; a single port p is PortRange{p, p}. For ICMP and ICMPv6 the source
// "port" is the type and the destination "port" the code, as in packet.Flow.
type PortRange struct{ Lo, Hi uint16 }

// Any reports whether r is the zero value, which matches every port.
func (r PortRange) Any() bool { return r.Lo == 0 && r.Hi == 0 }

// Contains reports whether p is in r.
func (r PortRange) Contains(p uint16) bool {
	return r.Any() || r.Lo <= p && p <= r.Hi
}

// width returns how many ports r holds (65536 for any).
func (r PortRange) width() uint32 {
	if r.Any() {
		return 1 << 16
	}
	return uint32(r.Hi) - uint32(r.Lo) + 1
}

// String returns "80", "1024-65535" or "any".
func (r PortRange) String() string {
	switch {
	case r.Any():
		return "any"
	case r.Lo == r.Hi:
		return strconv.Itoa(int(r.Lo))
	}
	return strconv.Itoa(int(r.Lo)) + "-" + strconv.Itoa(int(r.Hi))
}

// Selector describes traffic by its inner addresses, protocol and ports. A
// zero (invalid) prefix matches any address of either family; Proto 0
// matches any protocol; a zero PortRange matches any port.
type Selector struct {
	Src, Dst           netip.Prefix
	Proto              uint8
	SrcPorts, DstPorts PortRange
}

// Match reports whether the flow is traffic the selector describes.
func (s Selector) Match(f packet.Flow) bool {
	return (!s.Src.IsValid() || s.Src.Contains(f.Src)) &&
		(!s.Dst.IsValid() || s.Dst.Contains(f.Dst)) &&
		(s.Proto == 0 || s.Proto == f.Proto) &&
		s.SrcPorts.Contains(f.SrcPort) &&
		s.DstPorts.Contains(f.DstPort)
}

// Validate reports what makes the selector unusable: prefixes of different
// families or a port range whose low end is above its high end.
func (s Selector) Validate() error {
	if s.Src.IsValid() && s.Dst.IsValid() && s.Src.Addr().Is4() != s.Dst.Addr().Is4() {
		return fmt.Errorf("sa: selector mixes address families (src %v, dst %v)", s.Src, s.Dst)
	}
	if !s.SrcPorts.Any() && s.SrcPorts.Lo > s.SrcPorts.Hi {
		return fmt.Errorf("sa: selector source port range %d-%d is empty", s.SrcPorts.Lo, s.SrcPorts.Hi)
	}
	if !s.DstPorts.Any() && s.DstPorts.Lo > s.DstPorts.Hi {
		return fmt.Errorf("sa: selector destination port range %d-%d is empty", s.DstPorts.Lo, s.DstPorts.Hi)
	}
	return nil
}

// normalized returns s with the host bits of its prefixes cleared, so that
// selectors describing the same traffic compare equal.
func (s Selector) normalized() Selector {
	if s.Src.IsValid() {
		s.Src = s.Src.Masked()
	}
	if s.Dst.IsValid() {
		s.Dst = s.Dst.Masked()
	}
	return s
}

// String returns the selector in the style of ip-xfrm(8):
// "src 10.0.0.0/24 dst 10.1.0.0/24 proto 6 sport any dport 80".
func (s Selector) String() string {
	var b strings.Builder
	b.WriteString("src ")
	b.WriteString(prefixString(s.Src))
	b.WriteString(" dst ")
	b.WriteString(prefixString(s.Dst))
	if s.Proto != 0 {
		b.WriteString(" proto ")
		b.WriteString(strconv.Itoa(int(s.Proto)))
	}
	if !s.SrcPorts.Any() {
		b.WriteString(" sport ")
		b.WriteString(s.SrcPorts.String())
	}
	if !s.DstPorts.Any() {
		b.WriteString(" dport ")
		b.WriteString(s.DstPorts.String())
	}
	return b.String()
}

func prefixString(p netip.Prefix) string {
	if !p.IsValid() {
		return "any"
	}
	return p.String()
}
