package conn

import (
	"errors"

	"github.com/espd/espd/packet"
)

// header returns p's outer header.
func header(p *Packet) packet.TunnelHeader {
	return packet.TunnelHeader{
		Src: p.Src, Dst: p.Dst, SrcPort: p.SrcPort, DstPort: p.DstPort, Protocol: packet.ProtoESP,
		TOS: p.TOS, TTL: p.TTL, DF: p.DF, ID: p.ID, FlowLabel: p.FlowLabel,
	}
}

// OuterLen returns the length of the outer header a sender writes in
// front of a packet to e: IPv4 or IPv6, and UDP for ESP-in-UDP.
func OuterLen(e *Endpoint) int {
	h := packet.TunnelHeader{Dst: e.Dst, DstPort: e.DstPort}
	return h.Len()
}

// PutOuter writes the outer header of p into its headroom and returns
// the complete IP packet (packet.PutTunnelHeader). Only the raw-socket
// path calls it: the UDP sockets send the ESP bytes as they are.
func PutOuter(p *Packet) ([]byte, error) {
	full, err := packet.PutTunnelHeader(p.Buf, p.Start, p.End, header(p))
	switch {
	case errors.Is(err, packet.ErrFamily):
		return nil, ErrEndpoint
	case errors.Is(err, packet.ErrShortBuffer):
		return nil, ErrHeadroom
	}
	return full, err
}

// FragmentCount returns how many fragments of at most mtu bytes an outer
// packet of n bytes (IP header included) becomes, or packet.ErrFragmentMTU if mtu
// leaves no room for eight bytes of payload per fragment. The data plane
// counts with it what Send will send.
func FragmentCount(n int, v6 bool, mtu int) (int, error) {
	return fragmentCount(n, v6, mtu)
}

func fragmentCount(n int, v6 bool, mtu int) (int, error) {
	hl := packet.IPv4HeaderLen // espd's outer IPv4 headers have no options
	if v6 {
		hl = packet.IPv6HeaderLen + 8
	}
	per := (mtu - hl) &^ 7
	if per < 8 {
		return 0, packet.ErrFragmentMTU
	}
	return (n - hl + per - 1) / per, nil
}

// fragmentIP splits the complete outer packet ip (IPv4, or IPv6 without
// extension headers) into fragments of at most mtu bytes written into
// frags, and returns how many there are. IPv6 fragments carry the
// identification id (IPv4 fragments keep the packet's own).
func fragmentIP(frags [][]byte, ip []byte, mtu int, id uint32) (int, error) {
	if ip[0]>>4 == 4 {
		return packet.FragmentIPv4(frags, ip, mtu)
	}
	return packet.FragmentIPv6(frags, ip, mtu, id)
}
