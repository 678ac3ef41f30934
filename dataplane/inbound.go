package dataplane

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"time"
	"unsafe"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/esp"
	"github.com/espd/espd/packet"
	"github.com/espd/espd/sa"
	"github.com/espd/espd/tun"
)

// readOuter is an inbound producer: one per outer socket.
func (d *Device) readOuter(r conn.Receiver) {
	defer d.wg.Done()
	defer d.in.producerDone()
	bs := min(d.cfg.Batch, d.pool.size)
	prod := newProducer(d.shards)
	var w *inWriter
	if d.readersComplete {
		w = d.newInWriter()
	}
	for {
		b := d.pool.get()
		b.out = false
		for i := range bs {
			b.msgs[i].Buf = b.elems[i].buf
		}
		n, err := r.Receive(b.msgs[:bs])
		if n > 0 {
			d.classifyIn(b, n, prod, w)
		} else {
			d.pool.put(b)
		}
		if err != nil {
			if d.closing.Load() {
				return
			}
			if errors.Is(err, os.ErrClosed) || errors.Is(err, net.ErrClosed) {
				d.log.Error("outer socket closed under the data plane: its receiver stopped")
				return
			}
			d.stats[cReadErrors].Add(1)
			d.logf(logOuterRead, "outer socket read failed", "err", err)
			if n == 0 {
				time.Sleep(readErrorPause)
			}
		}
	}
}

// classifyIn finds the inbound state of each of the n packets received
// into b and queues b.
func (d *Device) classifyIn(b *batch, n int, prod *producer, w *inWriter) {
	var l local
	var (
		haveSPI bool
		spi     uint32
		s       *sa.SA
		dec     *esp.Decapsulator
		k       uint8
		ifc     *iface
	)
	b.n = n
	live := 0
	for i := range n {
		m := &b.msgs[i]
		e := &b.elems[i]
		*e = elem{buf: e.buf, drop: dropCounted}
		l[cRxPackets]++
		if m.Err != nil || m.Start < conn.RecvOffset || m.Start > m.End || m.End > len(e.buf) {
			l[cMalformed]++
			continue
		}
		p := e.buf[m.Start:m.End]
		l[cRxBytes] += uint64(len(p))
		if m.UDP {
			switch esp.ClassifyUDP(p) {
			case esp.UDPESP:
			case esp.UDPKeepalive:
				l[cKeepalivesRx]++
				continue
			case esp.UDPIKE:
				l[cIKE]++
				d.deliverIKE(conn.IKEPacket{Src: m.Src, Dst: m.Dst, Data: p})
				continue
			default:
				l[cMalformed]++
				continue
			}
		}
		id, okSPI := esp.SPI(p)
		if !okSPI || len(p) < esp.HeaderLen {
			l[cMalformed]++
			continue
		}
		if !haveSPI || id != spi {
			haveSPI, spi = true, id
			s, dec = d.db.LookupInbound(id), nil
			if s != nil && b.hold(s) {
				dec = s.Decapsulator()
				k = shardOf(id, d.shards)
			}
		}
		if dec == nil {
			l[cInvalidSPI]++
			continue
		}
		if ifc == nil || ifc.id != s.IfID() {
			if ifc = d.iface(s.IfID()); ifc == nil {
				l[cNoInterface]++
				continue
			}
		}
		e.sa, e.dec, e.shard, e.ifc, e.transport = s, dec, k, ifc, s.Mode() == sa.ModeTransport
		e.start, e.end, e.tos = m.Start, m.End, m.TOS
		if m.UDP {
			e.from = m.Src
		}
		e.drop = pass
		prod.add(k)
		live++
	}
	switch {
	case live == 0:
		prod.reset()
		d.pool.put(b)
	case d.noWorkers || !d.inGauge.handsOff(d.in): // run to completion
		prod.reset()
		d.inGauge.timeCrypto(b, decrypt)
		b.release()
		d.writeBatch(w, b, allShards)
		d.pool.put(b)
		l[cCompletedBatches]++
	default:
		b.crypto.Add(1)
		l[cHandedOff]++
		l[cQueueDrops] += uint64(d.in.push(b, prod))
	}
	l.flush(&d.stats)
}

// decrypt is the workers' inbound step: replay check, decryption and the
// state's selector check of the inner packet (done here, in parallel,
// rather than in the in-order writer).
//
// The workers check the replay window but do not record in it
// (esp.Decapsulator.Open); the in-order writer records each authentic
// packet (esp.ReplayWindow.Update), as the kernel does with pcrypt
// (xfrm_replay_check before the crypto, xfrm_replay_advance in order
// after). Workers finish batches out of order: if each recorded its own
// packets, one overtaken by others holding later batches of the same state
// would find its packets behind the window whenever the workers are more
// than a window apart (8 workers with batches of 128 are, for any usual
// window). Recording in order also keeps ESN inference, which starts from
// the window's top, seeing the numbers in arrival order.
func decrypt(b *batch) {
	for i := range b.n {
		e := &b.elems[i]
		if e.drop != pass {
			continue
		}
		var inner []byte
		var seq uint64
		var err error
		if e.transport {
			inner, seq, err = openTransport(e)
		} else {
			inner, seq, err = e.dec.Open(e.buf[e.start:e.end], e.tos)
		}
		if esp.Authentic(err) && e.dec.Replay != nil {
			e.seq, e.record = seq, true
		}
		if err != nil {
			e.drop, e.reason = dropSA, sa.DropReasonOf(err)
			continue
		}
		e.start = offsetIn(e.buf, inner)
		e.end = e.start + len(inner)
		e.innerLen = len(inner)
		f, err := packet.ParseFlow(inner)
		if err != nil {
			e.drop, e.reason = dropSA, sa.DropInner
			continue
		}
		if !e.sa.AllowsInner(f) {
			e.drop, e.reason = dropSA, sa.DropSelector
		}
	}
}

// transportTTL is the TTL or hop limit of the IP header written in front
// of a transport-mode payload: the receivers do not read the outer one,
// and the packet is delivered to this host.
const transportTTL = 64

// openTransport opens e's transport-mode ESP packet, writing in front of
// its payload an IP header between the state's two endpoints with the
// outer TOS (ECN included) as it arrived.
func openTransport(e *elem) ([]byte, uint64, error) {
	src, dst := e.sa.Addrs()
	h := esp.IPHeader{Src: src, Dst: dst, TOS: e.tos, TTL: transportTTL}
	pkt, seq, err := e.dec.OpenTransport(e.buf, e.start, e.end, h)
	if err == nil && offsetIn(e.buf, pkt) < tun.MinWriteOffset {
		return nil, seq, esp.ErrMalformed // no room for the TUN's header (conn.RecvOffset)
	}
	return pkt, seq, err
}

// offsetIn returns the offset of sub, a non-empty sub-slice of buf (whose
// capacity the transform may have limited), in buf.
func offsetIn(buf, sub []byte) int {
	return int(uintptr(unsafe.Pointer(unsafe.SliceData(sub))) - uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
}

// inWriter is an in-order TUN writer's state.
type inWriter struct {
	acct accounting
	// bufs is the Write vector: the writer's own, since the stages of
	// several shards write the packets of one batch at once.
	bufs [][]byte
}

func (d *Device) newInWriter() *inWriter {
	return &inWriter{bufs: make([][]byte, d.pool.size)}
}

// writeLoop is shard k's inbound in-order stage: it takes the batches
// holding packets of its states in the order they were received, waits
// for their crypto, records the sequence numbers and writes those packets
// to the TUN.
func (d *Device) writeLoop(k int) {
	defer d.wg.Done()
	w := d.newInWriter()
	for b := range d.in.shards[k].inorder {
		b.crypto.Wait()
		d.writeBatch(w, b, k)
		d.in.finished(b, k)
	}
}

// writeBatch records the sequence numbers of the packets of b whose
// states are in shard k (all with allShards) and writes them to their
// states' interfaces, one Write per run of packets of one interface.
func (d *Device) writeBatch(w *inWriter, b *batch, k int) {
	var l local
	j := 0
	var to *iface
	for i := range b.n {
		e := &b.elems[i]
		if k != allShards && (e.sa == nil || int(e.shard) != k) {
			continue
		}
		if e.record {
			if err := e.dec.Replay.Update(e.seq); err != nil {
				// Another packet with this number was in flight.
				e.drop, e.reason = dropSA, sa.DropReplay
			}
		}
		if !w.acct.passes(e) {
			continue
		}
		if e.from.IsValid() {
			checkMapping(d.db, e.sa, e.from)
		}
		if e.ifc != to {
			d.writeRun(w, to, j, &l)
			to, j = e.ifc, 0
		}
		w.acct.add(e.sa, e.innerLen)
		w.bufs[j] = e.buf[e.start-tun.MinWriteOffset : e.end]
		j++
		l[cTUNTxBytes] += uint64(e.innerLen)
	}
	w.acct.flush()
	d.writeRun(w, to, j, &l)
	l.flush(&d.stats)
}

// writeRun writes the first j packets of w.bufs to the interface to.
func (d *Device) writeRun(w *inWriter, to *iface, j int, l *local) {
	if j == 0 {
		return
	}
	if to.closing.Load() { // RemoveInterface: the TUN is closed
		l[cNoInterface] += uint64(j)
	} else {
		l[cTUNTxPackets] += uint64(j)
		if err := to.tun.Write(w.bufs[:j], tun.MinWriteOffset); err != nil {
			l[cTUNWriteErrors]++
			d.logf(logTUNWrite, "TUN write failed", "packets", j, "err", err)
		}
	}
	clear(w.bufs[:j]) // drop the references to the batch's buffers
}

// checkMapping reports a NAT mapping change when an authentic packet of a
// UDP-encapsulated inbound state came from another address or port than
// the state's peer (RFC 3948 section 5: the control plane then updates the
// states to the new mapping).
func checkMapping(db *sa.DB, s *sa.SA, from netip.AddrPort) {
	if peer := s.Peer(); peer.Port() != 0 && peer != from {
		db.Mapping(s, from)
	}
}

// worker runs the crypto of both directions.
func (d *Device) worker() {
	defer d.wg.Done()
	out, in := d.out.crypto, d.in.crypto
	for out != nil || in != nil {
		select {
		case b, ok := <-out:
			if !ok {
				out = nil
				continue
			}
			d.outGauge.timeCrypto(b, encrypt)
			b.release()
			b.crypto.Done()
			d.out.unref(b)
		case b, ok := <-in:
			if !ok {
				in = nil
				continue
			}
			d.inGauge.timeCrypto(b, decrypt)
			b.release()
			b.crypto.Done()
			d.in.unref(b)
		}
	}
}

// deliverIKE hands an IKE datagram from the encapsulation port to
// IO.DeliverIKE, if the caller gave one (the IKE hand-off).
func (d *Device) deliverIKE(p conn.IKEPacket) {
	if d.io.DeliverIKE != nil {
		d.io.DeliverIKE(p)
	}
}
