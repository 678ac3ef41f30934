package sa

import "time"

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
	// SPIReservation is how long an SPI that AllocSPI returned stays
	// reserved if no AddSA consumes it. Default 60 s.
	SPIReservation time.Duration
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
	if o.SPIReservation <= 0 {
		o.SPIReservation = time.Minute
	}
}

// DB is the SA database and the security policy database. Its methods are
// safe for concurrent use; the lookups the data path makes take no lock.
type DB struct {
	opts  Options
	epoch time.Time // mono() counts from here

	sadb  // states, under sadb.mu
	spdb  // policies, under spdb.mu
	evdb  // subscriptions and the acquire limiter
	stats globalCounters
}

// NewDB returns an empty database with default options.
func NewDB() *DB { return NewDBWithOptions(Options{}) }

// NewDBWithOptions returns an empty database tuned by o.
func NewDBWithOptions(o Options) *DB {
	o.setDefaults()
	db := &DB{opts: o}
	// A second before now, so that mono() is never 0 ("never") for real
	// times.
	db.epoch = o.Now().Add(-time.Second)
	db.sadb.init()
	db.spdb.init()
	db.evdb.init()
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
