package dataplane

import (
	"errors"
	"os"
	"time"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/esp"
	"github.com/espd/espd/packet"
	"github.com/espd/espd/sa"
	"github.com/espd/espd/tun"
)

// outReader is the TUN reader's state. The lookups it caches are valid for
// one batch only, so that policy and state changes apply from the next
// batch on and a dead state is never used; the batch holds the states it
// uses until they are sealed.
type outReader struct {
	ifID uint32 // the interface read: its policies apply
	// previous packet's flow and policy
	havePol bool
	flow    packet.Flow
	pol     sa.Policy
	polOK   bool
	// previous protect policy's reqid and its state
	haveSA    bool
	reqid     uint32
	mode      sa.Mode
	s         *sa.SA
	enc       *esp.Encapsulator
	shard     uint8
	mtu       int
	innerMTU  int
	transport bool

	runs []seqRun
	prod *producer
	send *outSender // run to completion: the reader sends
	pmtu pmtuCache
	icmp icmpSender
}

// seqRun counts one state's packets in a batch and hands out the sequence
// numbers reserved for them.
type seqRun struct {
	s           *sa.SA
	count, left int // packets still to number; numbers granted, from next
	next        uint64
	again       bool // asked a second time: a grant may stop at a pair's block end
}

// readTUN is an outbound producer: one per interface.
func (d *Device) readTUN(ifc *iface) {
	defer d.wg.Done()
	defer d.out.producerDone()
	defer close(ifc.done)
	r := &outReader{ifID: ifc.id, runs: make([]seqRun, 0, 16), prod: newProducer(d.shards)}
	if d.readersComplete {
		r.send = d.newOutSender()
	}
	r.pmtu.init(&d.pmtu)
	r.icmp.init(d, ifc.tun)
	bs := min(ifc.tun.BatchSize(), d.pool.size)
	for {
		b := d.pool.get()
		b.out = true
		for i := range bs {
			b.bufs[i] = b.elems[i].buf
		}
		n, err := ifc.tun.Read(b.bufs[:bs], b.sizes[:bs], esp.MaxHeadroom)
		if n > 0 {
			d.classifyOut(r, b, n)
		} else {
			d.pool.put(b)
		}
		if err != nil && !errors.Is(err, tun.ErrTooManySegments) {
			if d.closing.Load() || ifc.closing.Load() {
				return
			}
			if errors.Is(err, os.ErrClosed) {
				d.log.Error("TUN device closed under the data plane: outbound stopped")
				return
			}
			d.stats[cReadErrors].Add(1)
			d.logf(logTUNRead, "TUN read failed", "err", err)
			if n == 0 {
				time.Sleep(readErrorPause) // do not spin on a persistent error
			}
		}
	}
}

// classifyOut looks up the policy and state of each of the n packets read
// into b, reserves their sequence numbers and queues b.
func (d *Device) classifyOut(r *outReader, b *batch, n int) {
	var l local
	r.havePol, r.haveSA = false, false
	b.n = n
	live := 0
	for i := range n {
		e := &b.elems[i]
		*e = elem{buf: e.buf, drop: dropCounted}
		l[cTUNRxPackets]++
		if sz := b.sizes[i]; sz <= 0 || sz > len(e.buf)-MaxFraming {
			l[cMalformed]++
			continue
		}
		e.start, e.end = esp.MaxHeadroom, esp.MaxHeadroom+b.sizes[i]
		pkt := e.buf[e.start:e.end]
		l[cTUNRxBytes] += uint64(len(pkt))
		f, err := packet.ParseFlow(pkt)
		if err != nil {
			l[cMalformed]++
			continue
		}
		if !r.havePol || f != r.flow {
			r.pol, r.polOK = d.db.LookupPolicy(r.ifID, sa.DirOut, f)
			r.flow, r.havePol = f, true
		}
		if !r.polOK {
			l[cNoPolicy]++
			continue
		}
		switch r.pol.Action {
		case sa.ActionProtect:
		case sa.ActionBypass:
			l[cBypassInTUN]++
			continue
		default:
			l[cPolicyDrops]++
			continue
		}
		if !r.haveSA || r.reqid != r.pol.ReqID || r.mode != r.pol.Mode {
			r.lookupSA(d, b, r.pol.ReqID, r.pol.Mode)
		}
		if r.s == nil {
			l[cNoSA]++
			d.db.Acquire(r.pol, f)
			continue
		}
		if len(pkt) > r.innerMTU {
			if r.transport {
				e.frag = fragForce // the host's own datagram: its ESP packet goes in fragments
			} else if e.frag = d.fragmentable(r, pkt, &l); e.frag == noFrag {
				r.s.Drop(sa.DropTooBig, 1)
				continue
			}
		}
		e.sa, e.enc, e.mtu, e.innerLen, e.shard, e.transport = r.s, r.enc, r.mtu, len(pkt), r.shard, r.transport
		e.drop = pass
		r.prod.add(r.shard)
		live++
	}
	switch {
	case live == 0:
		r.prod.reset()
		d.pool.put(b)
	case d.noWorkers || !d.outGauge.handsOff(d.out):
		r.prod.reset()
		r.reserve(b)
		d.outGauge.timeCrypto(b, encrypt)
		b.release()
		d.sendBatch(r.send, b, allShards)
		d.pool.put(b)
		l[cCompletedBatches]++
	default:
		r.reserve(b)
		b.crypto.Add(1)
		l[cHandedOff]++
		l[cQueueDrops] += uint64(d.out.push(b, r.prod))
	}
	l.flush(&d.stats)
}

// lookupSA finds the live outbound state of reqid and its framing, and
// holds the state for b. Only a state of the policy's mode serves it, as
// XFRM matches a template's mode.
func (r *outReader) lookupSA(d *Device, b *batch, reqid uint32, mode sa.Mode) {
	r.haveSA, r.reqid, r.mode = true, reqid, mode
	r.s, r.enc = nil, nil
	s := d.db.OutboundSA(reqid)
	if s == nil || s.IfID() != r.ifID || s.Mode() != mode || !b.hold(s) {
		return // a state serves the policies of its own interface only
	}
	enc := s.Encapsulator()
	if enc == nil {
		return
	}
	r.s, r.enc, r.shard = s, enc, shardOf(s.SPI(), d.shards)
	r.mtu = r.pmtu.get(enc.Outer.Dst)
	r.innerMTU = enc.InnerMTU(r.mtu)
	r.transport = mode == sa.ModeTransport
	if r.transport && r.innerMTU > 0 {
		// The packet's own header is the outer one: one header less.
		r.innerMTU += packet.IPv4HeaderLen
		if enc.Outer.Dst.Is6() {
			r.innerMTU += packet.IPv6HeaderLen - packet.IPv4HeaderLen
		}
	}
}

// fragmentable decides what happens to pkt, too large for the state's
// inner MTU: an IPv4 packet without DF travels in outer fragments (unless
// the state sets the outer DF); an IPv6 packet no larger than the IPv6
// minimum MTU, which every path must carry, does too, whatever the outer
// DF; any other draws a "fragmentation needed" or "packet too big" error
// and is dropped (noFrag).
func (d *Device) fragmentable(r *outReader, pkt []byte, l *local) fragMode {
	mtu := r.innerMTU
	if pkt[0]>>4 == 4 {
		if pkt[6]&0x40 == 0 {
			return fragOK
		}
	} else {
		if len(pkt) <= minIPv6MTU {
			return fragForce
		}
		mtu = max(mtu, minIPv6MTU)
	}
	r.icmp.tooBig(pkt, mtu, l)
	return noFrag
}

const minIPv6MTU = 1280

// readErrorPause is how long a reader waits after a read that failed
// without returning packets.
const readErrorPause = 10 * time.Millisecond

// reserve reserves the sequence numbers of b's live packets, once per
// state, and assigns them in order. Packets a state cannot number (it ran
// out of sequence numbers) are dropped.
func (r *outReader) reserve(b *batch) {
	runs := r.runs[:0]
	last := 0
	for i := range b.n {
		e := &b.elems[i]
		if e.drop != pass {
			continue
		}
		if last < len(runs) && runs[last].s == e.sa {
			runs[last].count++
			continue
		}
		found := false
		for j := range runs {
			if runs[j].s == e.sa {
				runs[j].count++
				last, found = j, true
				break
			}
		}
		if !found {
			runs = append(runs, seqRun{s: e.sa, count: 1})
			last = len(runs) - 1
		}
	}
	for j := range runs {
		runs[j].next, runs[j].left = runs[j].s.ReserveSeq(runs[j].count)
	}
	last = 0
	for i := range b.n {
		e := &b.elems[i]
		if e.drop != pass {
			continue
		}
		if runs[last].s != e.sa {
			for j := range runs {
				if runs[j].s == e.sa {
					last = j
					break
				}
			}
		}
		run := &runs[last]
		if run.left == 0 && !run.again {
			run.again = true
			run.next, run.left = run.s.ReserveSeq(run.count)
		}
		if run.left == 0 {
			e.drop, e.reason = dropSA, sa.DropSequence
			continue
		}
		e.seq = run.next
		run.next++
		run.left--
		run.count--
	}
	for j := range runs {
		runs[j].s, runs[j].again = nil, false
	}
	r.runs = runs[:0]
}

// encrypt is the workers' outbound step.
func encrypt(b *batch) {
	for i := range b.n {
		e := &b.elems[i]
		if e.drop != pass {
			continue
		}
		if e.transport {
			p, err := e.enc.EncapsulateTransport(e.buf, e.start, e.end-e.start, e.seq)
			if err != nil {
				e.drop, e.reason = dropSA, sa.DropReasonOf(err)
				continue
			}
			e.start, e.end, e.tos, e.df = p.ESP, p.End, p.TOS, p.DF
			e.ttl, e.ipID, e.flowLabel = p.TTL, p.ID, p.FlowLabel
			continue
		}
		p, err := e.enc.Encapsulate(e.buf, e.start, e.end-e.start, e.seq)
		if err != nil {
			e.drop, e.reason = dropSA, sa.DropReasonOf(err)
			continue
		}
		e.start, e.end, e.tos, e.df = p.ESP, p.End, p.TOS, p.DF
	}
}

// outSender is the in-order sender's state.
type outSender struct {
	pkts []conn.Packet
	acct accounting
}

func (d *Device) newOutSender() *outSender {
	return &outSender{pkts: make([]conn.Packet, 0, d.pool.size)}
}

// sendLoop is shard k's outbound in-order stage: it takes the batches
// holding packets of its states in the order they were read, waits for
// their crypto and sends those packets.
func (d *Device) sendLoop(k int) {
	defer d.wg.Done()
	s := d.newOutSender()
	for b := range d.out.shards[k].inorder {
		b.crypto.Wait()
		d.sendBatch(s, b, k)
		d.out.finished(b, k)
	}
}

// allShards, as sendBatch's or writeBatch's shard, takes the packets of
// every shard: the batch is run to completion.
const allShards = -1

// sendBatch sends the packets of b whose states are in shard k (all with
// allShards).
func (d *Device) sendBatch(s *outSender, b *batch, k int) {
	var l local
	s.pkts = s.pkts[:0]
	var want int // outer packets the Bind is to send, fragments counted
	for i := range b.n {
		e := &b.elems[i]
		if k != allShards && (e.sa == nil || int(e.shard) != k) {
			continue
		}
		if !s.acct.passes(e) {
			continue
		}
		p := conn.Packet{
			Buf: e.buf, Start: e.start, End: e.end, Endpoint: endpoint(&e.enc.Outer),
			TOS: e.tos, DF: e.df, ID: uint16(e.seq),
		}
		if e.transport { // the packet's own header fields
			p.TTL, p.ID, p.FlowLabel = e.ttl, e.ipID, e.flowLabel
		}
		size := conn.OuterLen(&p.Endpoint) + e.end - e.start
		k := 1
		if size > e.mtu && e.frag != noFrag {
			if e.frag == fragForce {
				if p.DF && e.transport {
					// The host may have left the ID 0 on a DF packet;
					// fragments need one of their own.
					p.ID = uint16(e.seq)
				}
				p.DF = false
			}
			var err error
			if k, err = conn.FragmentCount(size, p.Dst.Is6(), e.mtu); err != nil {
				s.acct.drop(e.sa, sa.DropTooBig)
				continue
			}
			p.FragmentAbove = e.mtu
			l[cFragments] += uint64(k)
			size += fragmentOverhead(k, p.Dst.Is6())
		}
		s.acct.add(e.sa, e.innerLen)
		s.pkts = append(s.pkts, p)
		want += k
		l[cTxBytes] += uint64(size)
	}
	s.acct.flush()
	if len(s.pkts) > 0 {
		n, err := d.io.Bind.Send(s.pkts)
		l[cTxPackets] += uint64(want)
		if failed := want - n; failed > 0 {
			l[cSendErrors] += uint64(failed)
			d.logf(logSend, "outer send failed", "packets", failed, "err", err)
		}
		clear(s.pkts) // drop the references to the batch's buffers
	}
	l.flush(&d.stats)
}

// fragmentOverhead is the header bytes that splitting an outer packet in
// k fragments adds: an IPv4 header per extra fragment; an IPv6 header per
// extra fragment and a Fragment header in each.
func fragmentOverhead(k int, v6 bool) int {
	if v6 {
		return (k-1)*packet.IPv6HeaderLen + k*8
	}
	return (k - 1) * packet.IPv4HeaderLen
}
