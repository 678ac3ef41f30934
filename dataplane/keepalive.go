package dataplane

import (
	"time"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/esp"
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
	var pkts []conn.Packet
	var bytes uint64
	for _, s := range d.db.SAs() {
		if s.Dir() != sa.DirOut || !s.Alive() {
			continue
		}
		enc := s.Encapsulator()
		if enc == nil || enc.Outer.DstPort == 0 {
			continue
		}
		buf := make([]byte, conn.HeaderRoom+1)
		esp.PutKeepalive(buf[conn.HeaderRoom:])
		p := conn.Packet{Buf: buf, Start: conn.HeaderRoom, End: len(buf), Endpoint: endpoint(&enc.Outer)}
		pkts = append(pkts, p)
		bytes += uint64(conn.OuterLen(&p.Endpoint) + 1)
	}
	if len(pkts) == 0 {
		return 0
	}
	n, err := d.io.Bind.Send(pkts)
	d.stats[cKeepalivesTx].Add(uint64(n))
	d.stats[cTxPackets].Add(uint64(len(pkts)))
	d.stats[cTxBytes].Add(bytes)
	if n < len(pkts) {
		d.stats[cSendErrors].Add(uint64(len(pkts) - n))
		d.logf(logKeepalive, "NAT-keepalive send failed", "err", err)
	}
	return n
}

// endpoint returns the outer path of a state's Outer.
func endpoint(o *esp.Outer) conn.Endpoint {
	return conn.Endpoint{Src: o.Src, Dst: o.Dst, SrcPort: o.SrcPort, DstPort: o.DstPort, TTL: o.TTLOrDefault()}
}
