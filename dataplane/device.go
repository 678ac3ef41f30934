package dataplane

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/esp"
	"github.com/espd/espd/sa"
	"github.com/espd/espd/tun"
)

// TUN is the cleartext side of the pipeline; *tun.Device implements it.
type TUN interface {
	// BatchSize is the number of buffers Read wants.
	BatchSize() int
	// MTU is the interface MTU: the largest packet Read returns.
	MTU() int
	// Read reads packets into bufs[i][offset:] and their sizes into sizes.
	Read(bufs [][]byte, sizes []int, offset int) (int, error)
	// Write writes the packets bufs[i][offset:]; offset is at least
	// tun.MinWriteOffset. It is called from several goroutines at once
	// (the inbound in-order stage of each shard, the inbound readers that
	// run batches to completion, and the outbound reader's ICMP errors).
	Write(bufs [][]byte, offset int) error
	// Stats returns the device's system-call counters (zero on fakes
	// that do not count).
	Stats() tun.Stats
	// Close makes blocked and later Reads fail.
	Close() error
}

// IO is what a Device runs on, from the caller: the TUN device and the
// outer sockets (which the Device owns from Start on and closes in
// Close), and the callbacks into the rest of espd.
type IO struct {
	TUN  TUN
	Bind conn.Bind
	// PathMTU, if set, is the MTU of the route to an outer destination,
	// asked off the packet path (the refresher) and by a TUN reader on
	// its first packet to a peer. Without it the outer MTU is
	// Config.OuterMTU or DefaultOuterMTU.
	PathMTU func(dst netip.Addr) (int, error)
	// DeliverIKE, if set, takes the non-ESP datagrams that arrive on the
	// encapsulation port (the IKE hand-off); p.Data is only borrowed.
	DeliverIKE func(p conn.IKEPacket)
}

// Device is the data plane: the pipeline between a TUN device and the
// outer sockets, driven by the states and policies of an sa.DB.
type Device struct {
	cfg Config
	db  *sa.DB
	log *slog.Logger

	io   IO
	pool *pool
	out  *queues
	in   *queues
	// shards is the number of in-order shards per direction
	// (shardCount): a state's packets go through the stage of its shard.
	shards int

	noWorkers bool // no workers: readers run every batch to completion
	// readersComplete: readers run some or all batches to completion (no
	// workers, or workers with HandOffBelow), so each needs its own
	// sender or writer.
	readersComplete bool
	outGauge        handOffGauge
	inGauge         handOffGauge
	handOffWake     chan struct{} // the gauges' changes, for reportHandOff
	stats           counters
	live            atomic.Pointer[IO] // io, once started, for Stats
	main            *iface             // io.TUN, interface ID 0
	ifaces          atomic.Pointer[ifaceMap]
	closing         atomic.Bool
	started         bool
	stop            chan struct{}
	pmtu            pathMTUs // the outer path MTU of each peer
	wg              sync.WaitGroup

	mu        sync.Mutex // serializes Start and Close
	closed    bool
	closeErr  error
	logLimits [numLogLimits]conn.LogLimit // once a second per kind
}

// New returns a Device that is not started. log may be nil.
func New(cfg Config, db *sa.DB, log *slog.Logger) (*Device, error) {
	if db == nil {
		return nil, errors.New("dataplane: nil sa.DB")
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &Device{cfg: cfg, db: db, log: log, stop: make(chan struct{}), noWorkers: cfg.Workers == 0}
	d.readersComplete = d.noWorkers || cfg.HandOffBelow > 0
	if !d.noWorkers && cfg.HandOffBelow > 0 {
		d.outGauge.below.Store(int64(cfg.HandOffBelow))
		d.inGauge.below.Store(int64(cfg.HandOffBelow))
		d.outGauge.changed, d.inGauge.changed = d.handOffChanged, d.handOffChanged
		d.handOffWake = make(chan struct{}, 1)
	}
	return d, nil
}

// Config returns the configuration with defaults filled in.
func (d *Device) Config() Config { return d.cfg }

// Start starts the pipeline on io, which the Device owns from then on; if
// Start fails, io is still the caller's.
func (d *Device) Start(io IO) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.started || d.closed {
		return errors.New("dataplane: device already started")
	}
	if io.TUN == nil || io.Bind == nil {
		return errors.New("dataplane: IO needs a TUN and a Bind")
	}
	if io.TUN.MTU() > BufferSize-MaxFraming {
		return fmt.Errorf("dataplane: TUN MTU %d above %d", io.TUN.MTU(), BufferSize-MaxFraming)
	}
	d.started = true
	d.io = io
	d.live.Store(&d.io)
	d.pool = newPool(max(io.TUN.BatchSize(), d.cfg.Batch))
	d.shards = shardCount(d.cfg.Workers)
	perShard := shardQueueLen(d.cfg.QueueLen, d.shards)
	d.out = newQueues(d.shards, perShard, d.pool)
	d.in = newQueues(d.shards, perShard, d.pool)

	d.pmtu.init(d.cfg.OuterMTU, io.PathMTU)
	if d.pmtu.routed() {
		d.wg.Add(1)
		go d.refresher()
	}
	d.main = &iface{tun: io.TUN, done: make(chan struct{})}
	d.out.wg.Add(1)
	d.wg.Add(1)
	go d.readTUN(d.main)
	d.in.wg.Add(len(io.Bind.Receivers()))
	for _, r := range io.Bind.Receivers() {
		d.wg.Add(1)
		go d.readOuter(r)
	}
	d.wg.Add(2)
	go func() { defer d.wg.Done(); d.out.closeWhenDone() }()
	go func() { defer d.wg.Done(); d.in.closeWhenDone() }()
	if !d.noWorkers {
		d.wg.Add(d.cfg.Workers + 2*d.shards)
		for range d.cfg.Workers {
			go d.worker()
		}
		for k := range d.shards {
			go d.sendLoop(k)
			go d.writeLoop(k)
		}
	}
	if d.cfg.Keepalive > 0 {
		d.wg.Add(1)
		go d.keepalives()
	}
	if d.handOffWake != nil && d.cfg.OnHandOff != nil {
		d.wg.Add(1)
		go d.reportHandOff()
	}
	d.log.Info("data plane started", "workers", d.cfg.Workers, "shards", d.shards, "batch", d.pool.size, "queue", d.cfg.QueueLen)
	return nil
}

// MaxFraming is the room around an inner packet in its buffer: the
// headroom and trailer of the largest ESP framing.
const MaxFraming = esp.MaxHeadroom + esp.MaxTrailer

// Close stops the pipeline and closes the TUN device and the sockets.
// Packets in flight are sent or written before the sockets close. The
// caller closes its routes into the TUN first (daemon), so that traffic
// stops entering it.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return d.closeErr
	}
	d.closed = true
	if !d.started {
		return nil
	}
	d.closing.Store(true)
	close(d.stop)
	var errs []error
	errs = append(errs, d.io.TUN.Close())
	errs = append(errs, d.closeInterfaces()...)
	for _, r := range d.io.Bind.Receivers() {
		errs = append(errs, r.Close())
	}
	d.wg.Wait()
	errs = append(errs, d.io.Bind.Close())
	d.closeErr = errors.Join(errs...)
	d.log.Info("data plane stopped")
	return d.closeErr
}

// Stats returns a snapshot of the global counters.
func (d *Device) Stats() Stats {
	st := d.stats.snapshot()
	io := d.live.Load()
	if io == nil {
		return st
	}
	ts := io.TUN.Stats()
	if m := d.ifaces.Load(); m != nil {
		for _, ifc := range *m {
			s := ifc.tun.Stats()
			ts.Reads, ts.SuperReads, ts.Writes, ts.SuperWrites = ts.Reads+s.Reads, ts.SuperReads+s.SuperReads, ts.Writes+s.Writes, ts.SuperWrites+s.SuperWrites
			ts.QueueDrops, ts.URingEnters = ts.QueueDrops+s.QueueDrops, ts.URingEnters+s.URingEnters
		}
	}
	st.TUNReads, st.TUNSuperReads, st.TUNWrites, st.TUNSuperWrites = ts.Reads, ts.SuperReads, ts.Writes, ts.SuperWrites
	st.TUNQueueDrops, st.TUNUringEnters = ts.QueueDrops, ts.URingEnters
	cs := io.Bind.Stats()
	st.RecvCalls, st.RecvDatagrams = cs.RecvCalls, cs.RecvDatagrams
	st.SendCalls, st.SendMessages = cs.SendCalls, cs.SendMessages
	return st
}

// logLimit is a kind of warning logf limits to one a second.
type logLimit int

const (
	logTUNRead logLimit = iota
	logOuterRead
	logTUNWrite
	logSend
	logKeepalive
	numLogLimits
)

// logf logs a warning that packets or the network can trigger: at most
// once a second per kind, with the number held back since the last
// (conn.LogLimit).
func (d *Device) logf(k logLimit, msg string, args ...any) {
	d.logLimits[k].Warn(d.log, msg, args...)
}

// handOffChanged wakes reportHandOff. The gauges call it from the data
// path, so it only signals: Config.OnHandOff (espd's GOMAXPROCS change
// stops the world) runs in reportHandOff's goroutine.
func (d *Device) handOffChanged() {
	select {
	case d.handOffWake <- struct{}{}:
	default: // a report is pending; it reads the latest state
	}
}

// handOffReportInterval is the least time between two Config.OnHandOff
// calls: a rate hovering around HandOffBelow flips the gauges back and
// forth, and each GOMAXPROCS change stops the world.
const handOffReportInterval = 500 * time.Millisecond

// reportHandOff tells Config.OnHandOff whether either direction hands its
// batches off, when that changed, from a goroutine of its own and at most
// every handOffReportInterval.
func (d *Device) reportHandOff() {
	defer d.wg.Done()
	reported := false
	for {
		select {
		case <-d.stop:
			return
		case <-d.handOffWake:
		}
		if h := d.outGauge.handing.Load() || d.inGauge.handing.Load(); h != reported {
			reported = h
			d.cfg.OnHandOff(h)
		}
		select {
		case <-d.stop:
			return
		case <-time.After(handOffReportInterval):
		}
	}
}
