package dataplane

import (
	"time"

	"github.com/espd/espd/esp"
	"github.com/espd/espd/packet"
	"github.com/espd/espd/sa"
)

// keepalives sends a NAT-keepalive (RFC 3948 section 2.3) every
// Config.Keepalive (> 0) for every live outbound state with UDP
// encapsulation, from its encapsulation source port to its destination
// port.
func (d *Device) keepalives() {
	defer d.wg.Done()
	t := time.NewTicker(d.cfg.Keepalive)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
			d.sendKeepalives()
		}
	}
}

// sendKeepalives sends one keepalive per outbound UDP-encapsulated state.
func (d *Device) sendKeepalives() int {
	var pkts [][]byte
	for _, s := range d.db.SAs() {
		if s.Dir() != sa.DirOut || !s.Alive() {
			continue
		}
		enc := s.Encapsulator()
		if enc == nil || enc.Outer.DstPort == 0 {
			continue
		}
		if p, err := keepalivePacket(&enc.Outer); err == nil {
			pkts = append(pkts, p)
		}
	}
	if len(pkts) == 0 {
		return 0
	}
	n, err := d.io.Sender.Send(pkts)
	d.stats[cKeepalivesTx].Add(uint64(n))
	d.stats[cTxPackets].Add(uint64(len(pkts)))
	var bytes uint64
	for _, p := range pkts {
		bytes += uint64(len(p))
	}
	d.stats[cTxBytes].Add(bytes)
	if n < len(pkts) {
		d.stats[cSendErrors].Add(uint64(len(pkts) - n))
		d.logf(logKeepalive, "NAT-keepalive send failed", "err", err)
	}
	return n
}

// keepalivePacket builds the outer packet of a NAT-keepalive for o.
func keepalivePacket(o *esp.Outer) ([]byte, error) {
	ttl := o.TTL
	if ttl == 0 {
		ttl = 64
	}
	if o.Src.Is4() {
		p := make([]byte, packet.IPv4HeaderLen+packet.UDPHeaderLen+1)
		if _, err := packet.PutIPv4Header(p, packet.IPv4Header{
			TotalLen: uint16(len(p)), TTL: ttl, Protocol: packet.ProtoUDP, Src: o.Src, Dst: o.Dst,
		}); err != nil {
			return nil, err
		}
		packet.PutUDPHeader(p[packet.IPv4HeaderLen:], o.SrcPort, o.DstPort, 1)
		esp.PutKeepalive(p[packet.IPv4HeaderLen+packet.UDPHeaderLen:])
		return p, nil
	}
	p := make([]byte, packet.IPv6HeaderLen+packet.UDPHeaderLen+1)
	if _, err := packet.PutIPv6Header(p, packet.IPv6Header{
		PayloadLen: packet.UDPHeaderLen + 1, NextHeader: packet.ProtoUDP, HopLimit: ttl, Src: o.Src, Dst: o.Dst,
	}); err != nil {
		return nil, err
	}
	u := p[packet.IPv6HeaderLen:]
	packet.PutUDPHeader(u, o.SrcPort, o.DstPort, 1)
	esp.PutKeepalive(u[packet.UDPHeaderLen:])
	if err := packet.SetUDPChecksum(u, o.Src, o.Dst); err != nil {
		return nil, err
	}
	return p, nil
}
