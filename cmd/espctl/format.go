package main

import (
	"fmt"
	"io"
	"math"
	"net/netip"
	"strings"
	"time"

	"github.com/espd/espd/control"
	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/sa"
)

// redacted is what espctl prints where keys would be: espd never returns
// them.
const redacted = "[redacted]"

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return "any"
	}
	return a.String()
}

func prefixString(p netip.Prefix) string {
	if !p.IsValid() {
		return "any"
	}
	return p.String()
}

// selectorString formats a selector as ip-xfrm(8) does.
func selectorString(s sa.Selector) string {
	var b strings.Builder
	fmt.Fprintf(&b, "src %s dst %s", prefixString(s.Src), prefixString(s.Dst))
	if s.Proto != 0 {
		fmt.Fprintf(&b, " proto %s", protoName(s.Proto))
	}
	if !s.SrcPorts.Any() {
		fmt.Fprintf(&b, " sport %v", s.SrcPorts)
	}
	if !s.DstPorts.Any() {
		fmt.Fprintf(&b, " dport %v", s.DstPorts)
	}
	return b.String()
}

// lifetimeString formats limits, "none" if there are none.
func lifetimeString(l sa.Lifetime) string {
	var parts []string
	if l.Bytes != 0 {
		parts = append(parts, fmt.Sprintf("%d bytes", l.Bytes))
	}
	if l.Packets != 0 {
		parts = append(parts, fmt.Sprintf("%d packets", l.Packets))
	}
	if l.AddTime != 0 {
		parts = append(parts, fmt.Sprintf("add %v", l.AddTime))
	}
	if l.UseTime != 0 {
		parts = append(parts, fmt.Sprintf("use %v", l.UseTime))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// algString describes the algorithms with their IKEv2 names.
func algString(s crypto.Suite) string {
	enc := s.Encryption.String()
	if s.KeyBits != 0 {
		enc += fmt.Sprintf(" %d", s.KeyBits)
	}
	if s.Integrity != crypto.AuthNone {
		enc += ", " + s.Integrity.String()
	}
	return fmt.Sprintf("%v (%s)", s, enc)
}

// timeString formats a timestamp with its age, "never" for zero.
func timeString(t, now time.Time) string {
	if t.IsZero() {
		return "never"
	}
	age := now.Sub(t).Round(time.Second)
	return fmt.Sprintf("%s (%v ago)", t.Local().Format("2006-01-02 15:04:05"), age)
}

// dropsString lists the non-zero drop counters.
func dropsString(d *[sa.NumDropReasons]uint64) string {
	var parts []string
	for r := range sa.NumDropReasons {
		if d[r] != 0 {
			parts = append(parts, fmt.Sprintf("%v %d", r, d[r]))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// printSA prints a state in the style of ip xfrm state and swanctl
// --list-sas.
func printSA(w io.Writer, in wire.SAInfo, now time.Time) {
	c, st := in.Config, in.Stats
	if st.State == sa.StateLarval {
		fmt.Fprintf(w, "spi 0x%08x dir %v state larval (SPI reserved, added %s)\n", c.SPI, c.Dir, timeString(st.AddTime, now))
		return
	}
	fmt.Fprintf(w, "spi 0x%08x dir %v state %v reqid %d%s\n", c.SPI, c.Dir, st.State, c.ReqID, ifIDString(c.IfID))
	fmt.Fprintf(w, "\tsrc %s dst %s proto esp mode %v", addrString(c.Src), addrString(c.Dst), c.Mode)
	if c.EncapDstPort != 0 {
		fmt.Fprintf(w, " encap udp %d -> %d", c.EncapSrcPort, c.EncapDstPort)
	}
	fmt.Fprintln(w)
	// keying: negotiated by an IKE daemon (NEGOTIATED), or manual, whose
	// sequence-number record espd keeps for ever.
	fmt.Fprintf(w, "\talg %s keys %s keying %s\n", algString(c.Suite), redacted, keyingString(c.Negotiated))
	if c.Dir == sa.DirIn {
		fmt.Fprintf(w, "\treplay-window %d replay-top %d\n", c.ReplayWindow, in.ReplayTop)
		if len(in.ReplayBitmap) > 0 {
			// Bit i of the bytes (byte i/8, value 1<<(i%8)): replay-top
			// minus i received; what --replay-bitmap takes.
			fmt.Fprintf(w, "\treplay-bitmap 0x%x\n", in.ReplayBitmap)
		}
	} else {
		fmt.Fprintf(w, "\tseq-out %d\n", st.SeqOut)
	}
	if len(c.Selectors) == 0 {
		fmt.Fprintf(w, "\tsel any\n")
	}
	for _, s := range c.Selectors {
		fmt.Fprintf(w, "\tsel %s\n", selectorString(s))
	}
	if c.Dir == sa.DirOut {
		dscp := fmt.Sprint(c.DSCP)
		if c.CopyDSCP {
			dscp = "copy"
		}
		ttl := fmt.Sprint(c.TTL)
		if c.TTL == 0 {
			ttl = "64"
		}
		fmt.Fprintf(w, "\touter ttl %s dscp %s df %v ecn %s tfc %d\n", ttl, dscp, c.DF, onOff(c.ECN), c.TFCPadTo)
	} else {
		fmt.Fprintf(w, "\tecn %s\n", onOff(c.ECN))
	}
	fmt.Fprintf(w, "\tlifetime soft: %s\n", lifetimeString(c.Soft))
	fmt.Fprintf(w, "\tlifetime hard: %s\n", lifetimeString(c.Hard))
	fmt.Fprintf(w, "\tcurrent: %d bytes, %d packets\n", st.Bytes, st.Packets)
	fmt.Fprintf(w, "\tadded %s, first used %s\n", timeString(st.AddTime, now), timeString(st.FirstUse, now))
	fmt.Fprintf(w, "\tdrops: %s\n", dropsString(&st.Drops))
}

// ifIDString is " if_id N" for a state or policy of route-based
// interface N, as ip-xfrm(8) prints it (in decimal, as --if-id takes it),
// and "" for espd's policy-based TUN (0).
func ifIDString(id uint32) string {
	if id == 0 {
		return ""
	}
	return fmt.Sprintf(" if_id %d", id)
}

// keyingString names a state's key origin (sa.Config.Negotiated).
func keyingString(negotiated bool) string {
	if negotiated {
		return "negotiated"
	}
	return "manual"
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// printPolicy prints a policy in the style of ip xfrm policy.
func printPolicy(w io.Writer, p sa.Policy) {
	fmt.Fprintf(w, "%s\n", selectorString(p.Selector))
	fmt.Fprintf(w, "\tdir %v action %v priority %d index %d", p.Dir, p.Action, p.Priority, p.Index)
	if p.Action == sa.ActionProtect || p.ReqID != 0 {
		fmt.Fprintf(w, " reqid %d", p.ReqID)
	}
	fmt.Fprintf(w, "%s\n", ifIDString(p.IfID))
	// The template, as ip-xfrm(8) shows it: also a transport-mode one
	// without addresses, whose mode it is that tells.
	if p.TmplSrc.IsValid() || p.TmplDst.IsValid() || p.Mode != sa.ModeTunnel {
		fmt.Fprintf(w, "\ttmpl src %s dst %s proto esp mode %v\n", addrString(p.TmplSrc), addrString(p.TmplDst), p.Mode)
	}
}

// printSPI prints an SPI in hex.
func printSPI(w io.Writer, spi uint32) {
	fmt.Fprintf(w, "0x%08x\n", spi)
}

// printStats prints the global counters and each state's.
func printStats(w io.Writer, st control.Stats) {
	g := st.Global
	fmt.Fprintf(w, "states %d (larval %d), policies %d\n", g.States, g.Larval, g.Policies)
	fmt.Fprintf(w, "traffic: %d packets, %d bytes\n", g.Packets, g.Bytes)
	fmt.Fprintf(w, "drops: %s\n", dropsString(&g.Drops))
	fmt.Fprintf(w, "global drops: invalid-spi %d, malformed %d, policy %d, no-state %d, queue %d\n",
		g.InvalidSPI, g.Malformed, g.PolicyDrops, g.NoState, g.QueueDrops)
	fmt.Fprintf(w, "events: acquires %d (suppressed %d), dropped %d\n", g.Acquires, g.AcquiresSuppressed, g.EventsDropped)
	for _, in := range st.SAs {
		fmt.Fprintf(w, "spi 0x%08x dst %s dir %v reqid %d%s state %v: %d packets, %d bytes, drops: %s\n",
			in.Config.SPI, addrString(in.Config.Dst), in.Config.Dir, in.Config.ReqID, ifIDString(in.Config.IfID), in.Stats.State,
			in.Stats.Packets, in.Stats.Bytes, dropsString(&in.Stats.Drops))
	}
}

// printPair prints a gateway pair's status on one line:
// "node 1 role active released 3 silent 0 peer-heard 120ms".
func printPair(w io.Writer, st wire.PairStatus) {
	fmt.Fprintf(w, "node %d role %v released %d silent %d peer-heard %s\n",
		st.Node, st.Role, st.Released, st.Silent, peerHeardString(st.PeerHeardMs))
}

// peerHeardString formats the time since the other node was last heard,
// "never" for 0.
func peerHeardString(ms uint64) string {
	if ms == 0 {
		return "never"
	}
	if ms > uint64(math.MaxInt64/time.Millisecond) {
		return fmt.Sprintf("%dms", ms)
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

// printEvent prints one event on one line, prefixed by its time.
func printEvent(w io.Writer, e wire.Event) {
	t := e.Time
	if t.IsZero() {
		t = time.Now()
	}
	fmt.Fprintf(w, "%s %v\n", t.Local().Format("15:04:05.000"), e)
}
