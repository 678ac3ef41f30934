package sa

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Options tune a DB. The zero value of each field means its default.
type Options struct {
	// Now is the clock; nil means time.Now. Tests inject a fake one.
	Now func() time.Time
	// TickInterval is how often Run checks the time lifetimes and
	// expires SPI reservations. Default 1 s.
	TickInterval time.Duration
	// AcquireInterval is the least time between two acquire events for
	// the same policy and destination. Default 1 s; negative: no limit.
	AcquireInterval time.Duration
	// AcquireRate bounds the acquire events of all policies and
	// destinations together: at most AcquireRate a second, in bursts of
	// at most AcquireRate. Default DefaultAcquireRate; negative: no limit.
	AcquireRate int
	// SPIReservation is how long an SPI that AllocSPI returned stays
	// reserved if no AddSA consumes it. Default 60 s.
	SPIReservation time.Duration
	// Seq records how far each outbound key's sequence numbers may have
	// gone (see SeqStore); nil means a MemSeqStore, which protects the
	// keys for the life of the process only.
	Seq SeqStore
	// SeqBlock is how many sequence numbers an outbound state reserves
	// in Seq ahead of use; it extends the reservation when half of the
	// block is used. Default DefaultSeqBlock.
	SeqBlock uint64
	// SeqError, if set, is told of Seq failures that the DB can only
	// retry or put up with: extending a reservation (retried; the state
	// sends nothing past its reservation meanwhile) and recording a
	// removed state's last number (the reservation stays recorded, which
	// costs sequence numbers, never safety). Failures when a state is
	// added are returned by AddSA and Apply instead.
	SeqError func(error)
	// Loopback lets an inbound state share its key with the live
	// outbound state of the same SPI, so that a DB can decrypt its own
	// output: for tests that loop a data plane back to itself. A gateway
	// must never set it: the peer numbers its packets under its own
	// counter, and the same key in both directions repeats nonces.
	Loopback bool
	// PairNode, 1 or 2, makes the DB one node of a gateway pair that
	// shares its outbound keys with the other node: it hands out only
	// the numbers of its own blocks of SeqBlock (see SetStandby). 0: no
	// pair.
	PairNode int
	// PairLocal, with PairNode, reports whether a state whose local
	// address (an outbound state's source, an inbound state's
	// destination) is local belongs to this node alone (the ha plugin's
	// own tunnel between the two nodes, say): such a state numbers as
	// outside a pair, is never silent and keeps its key in LocalSeq. It
	// is decided once, when the state is added. nil: every state is the
	// pair's.
	PairLocal func(local netip.Addr) bool
	// LocalSeq is the SeqStore of the node's own states (PairLocal);
	// nil: Seq.
	LocalSeq SeqStore
}

func (o *Options) setDefaults() {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.TickInterval <= 0 {
		o.TickInterval = time.Second
	}
	if o.AcquireInterval == 0 {
		o.AcquireInterval = time.Second
	}
	if o.AcquireRate == 0 {
		o.AcquireRate = DefaultAcquireRate
	}
	if o.SPIReservation <= 0 {
		o.SPIReservation = time.Minute
	}
	if o.Seq == nil {
		o.Seq = NewMemSeqStore()
	}
	if o.SeqBlock == 0 {
		o.SeqBlock = DefaultSeqBlock
	}
}

// DB is the SA database and the security policy database. Its methods are
// safe for concurrent use; the lookups the data path makes take no lock.
type DB struct {
	opts  Options
	epoch time.Time // mono() counts from here

	// keying serializes the changes that touch keys and the SeqStore:
	// adding and removing states (AddSA, Apply, DeleteSA, FlushSAs) and
	// retiring them. The data path never takes it.
	keying sync.Mutex
	// standby: a pair's standby, whose new outbound states are silent
	// (SetStandby). Changed with keying held.
	standby atomic.Bool

	sadb  // states, under sadb.mu
	spdb  // policies, under spdb.mu
	evdb  // subscriptions and the acquire limiters
	stats globalCounters
}

// NewDB returns an empty database tuned by o (the zero Options: espd's
// defaults).
func NewDB(o Options) *DB {
	o.setDefaults()
	db := &DB{opts: o}
	// A second before now, so that mono() is never 0 ("never") for real
	// times.
	db.epoch = o.Now().Add(-time.Second)
	db.sadb.init()
	db.spdb.init()
	db.evdb.init(&db.opts)
	return db
}

// mono returns the time since epoch, at least 1 ns (even if the clock
// went back) so that 0 can mean "never".
func (db *DB) mono() int64 {
	return max(int64(db.opts.Now().Sub(db.epoch)), 1)
}

// wall converts a mono() value back to a time.
func (db *DB) wall(m int64) time.Time {
	if m == 0 {
		return time.Time{}
	}
	return db.epoch.Add(time.Duration(m))
}
