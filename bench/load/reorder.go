package load

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/espd/espd/testbed"
	"golang.org/x/net/ipv4"
)

// SeqCounter counts the datagrams of one sequence-numbered flow as they
// arrive, and how many of them were reordered: in RFC 4737's sense, a
// datagram is reordered if its sequence number is below the next one
// expected (one more than the highest seen so far). A datagram that
// arrives after a later one was counted is reordered once; the later ones
// are not. Lost datagrams are not reordering: a gap only moves the next
// expected number on. A duplicate of an already seen number also counts
// as reordered (it cannot be told apart without a history; ESP's replay
// window drops duplicates before they reach the receiver).
type SeqCounter struct {
	// Received counts the datagrams, Reordered those that came late.
	Received, Reordered uint64
	// Next is the next sequence number expected.
	Next uint64
}

// Add counts a datagram with sequence number seq.
func (c *SeqCounter) Add(seq uint64) {
	c.Received++
	if seq < c.Next {
		c.Reordered++
		return
	}
	c.Next = seq + 1
}

// Flow is one flow of the multi-flow generators: from Src (an address of
// the sending namespace) to Dst (an address of the receiving one).
type Flow struct {
	Src, Dst netip.Addr
}

// ProbeOptions describe a reorder probe: small UDP datagrams with a
// sequence number per flow, sent in back-to-back bursts (one sendmmsg) so
// that a data path that lets the packets of one flow pass each other
// shows it, at a rate low enough not to take from the traffic measured.
type ProbeOptions struct {
	// From sends, To receives; Flows are the flows, each with its own
	// socket bound to its source address.
	From, To *testbed.Node
	Flows    []Flow
	// Port is the receiver's port; 0 picks a free one.
	Port uint16
	// Rate is the datagrams per second over all flows; 0 means 4000.
	Rate int
	// Burst is the datagrams sent back to back to one flow; 0 means 8.
	Burst int
}

// probeSize is a probe datagram's payload: magic, flow index, sequence
// number, padding.
const probeSize = 64

var probeMagic = [4]byte{'e', 'r', 'p', '1'}

// ProbeCounts is what a probe counted for one flow.
type ProbeCounts struct {
	// Sent is what the sender's kernel accepted; Received and Reordered
	// are as in SeqCounter.
	Sent, Received, Reordered uint64
}

// Probe is a running reorder probe.
type Probe struct {
	o      ProbeOptions
	rx     *net.UDPConn
	tx     []*net.UDPConn
	mu     sync.Mutex
	counts []SeqCounter
	sent   []uint64
	bad    uint64
	cancel context.CancelFunc
	done   sync.WaitGroup
}

// StartProbe starts a reorder probe; Stop ends it. The counts are read
// with Snapshot, so that a caller counts exactly its measured window.
func StartProbe(ctx context.Context, o ProbeOptions) (*Probe, error) {
	if o.From == nil || o.To == nil || len(o.Flows) == 0 {
		return nil, errors.New("load: a probe needs From, To and flows")
	}
	if o.Rate <= 0 {
		o.Rate = 4000
	}
	if o.Burst <= 0 {
		o.Burst = 8
	}
	p := &Probe{o: o, counts: make([]SeqCounter, len(o.Flows)), sent: make([]uint64, len(o.Flows))}
	v6 := o.Flows[0].Dst.Is6()
	unspec := netip.IPv4Unspecified()
	if v6 {
		unspec = netip.IPv6Unspecified()
	}
	if err := o.To.Do(func() error {
		var err error
		p.rx, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(unspec, o.Port)))
		return err
	}); err != nil {
		return nil, fmt.Errorf("load: probe listen in %s: %w", o.To.Role, err)
	}
	_ = p.rx.SetReadBuffer(4 << 20)
	port := p.rx.LocalAddr().(*net.UDPAddr).AddrPort().Port()
	for _, f := range o.Flows {
		var c *net.UDPConn
		if err := o.From.Do(func() error {
			var err error
			c, err = net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(f.Src, 0)),
				net.UDPAddrFromAddrPort(netip.AddrPortFrom(f.Dst, port)))
			return err
		}); err != nil {
			p.close()
			return nil, fmt.Errorf("load: probe socket %v -> %v in %s: %w", f.Src, f.Dst, o.From.Role, err)
		}
		p.tx = append(p.tx, c)
	}
	ctx, p.cancel = context.WithCancel(ctx)
	p.done.Add(2)
	go p.receive(v6)
	go p.send(ctx, v6)
	return p, nil
}

func (p *Probe) close() {
	if p.rx != nil {
		p.rx.Close()
	}
	for _, c := range p.tx {
		c.Close()
	}
}

// receive counts what arrives until the socket is closed.
func (p *Probe) receive(v6 bool) {
	defer p.done.Done()
	pc := newBatchConn(p.rx, v6)
	msgs := make([]ipv4.Message, udpBatch)
	for i := range msgs {
		msgs[i].Buffers = [][]byte{make([]byte, 2048)}
	}
	for {
		n, err := pc.ReadBatch(msgs, 0)
		p.mu.Lock()
		for _, m := range msgs[:max(n, 0)] {
			p.count(m.Buffers[0][:m.N])
		}
		p.mu.Unlock()
		if err != nil && errors.Is(err, net.ErrClosed) {
			return
		}
	}
}

// putProbe writes a probe datagram of flow f with sequence number seq
// into b (probeSize bytes).
func putProbe(b []byte, f uint32, seq uint64) {
	copy(b, probeMagic[:])
	binary.BigEndian.PutUint32(b[4:], f)
	binary.BigEndian.PutUint64(b[8:], seq)
}

// count counts a received datagram (p.mu held).
func (p *Probe) count(b []byte) {
	if len(b) < 16 || [4]byte(b[:4]) != probeMagic {
		p.bad++
		return
	}
	i := binary.BigEndian.Uint32(b[4:])
	if int(i) >= len(p.counts) {
		p.bad++
		return
	}
	p.counts[i].Add(binary.BigEndian.Uint64(b[8:]))
}

// send sends a burst to one flow after another, paced to the rate.
func (p *Probe) send(ctx context.Context, v6 bool) {
	defer p.done.Done()
	interval := time.Duration(float64(time.Second) * float64(p.o.Burst) / float64(p.o.Rate))
	seq := make([]uint64, len(p.tx))
	msgs := make([]ipv4.Message, p.o.Burst)
	for i := range msgs {
		msgs[i].Buffers = [][]byte{make([]byte, probeSize)}
	}
	pcs := make([]batchConn, len(p.tx))
	for i, c := range p.tx {
		pcs[i] = newBatchConn(c, v6)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for f := 0; ; f = (f + 1) % len(p.tx) {
		for j := range msgs {
			putProbe(msgs[j].Buffers[0], uint32(f), seq[f]+uint64(j))
		}
		n, err := pcs[f].WriteBatch(msgs, 0)
		if n > 0 {
			// A datagram the kernel did not take leaves a gap, not
			// reordering: the numbers stay in sending order.
			seq[f] += uint64(p.o.Burst)
			p.mu.Lock()
			p.sent[f] += uint64(n)
			p.mu.Unlock()
		}
		if err != nil && errors.Is(err, net.ErrClosed) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Snapshot returns the counts so far, per flow.
func (p *Probe) Snapshot() []ProbeCounts {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]ProbeCounts, len(p.counts))
	for i, c := range p.counts {
		out[i] = ProbeCounts{Sent: p.sent[i], Received: c.Received, Reordered: c.Reordered}
	}
	return out
}

// Malformed returns the datagrams the probe's receiver could not read as
// probe datagrams.
func (p *Probe) Malformed() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bad
}

// Stop ends the probe, after a grace period of linger for datagrams
// still in flight.
func (p *Probe) Stop(linger time.Duration) {
	p.cancel()
	time.Sleep(linger)
	p.close()
	p.done.Wait()
}
