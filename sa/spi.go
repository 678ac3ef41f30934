package sa

import (
	"fmt"
	"math/rand/v2"
)

// minSPI is the lowest SPI AllocSPI hands out: RFC 4303 reserves 1-255
// and 0.
const minSPI = 256

// AllocSPI returns a random inbound SPI in [lo, hi] (raised to at least
// 256) that no inbound state uses and no other caller holds, and reserves
// it as a larval state: a later AddSA of an inbound state with that SPI
// consumes the reservation, DeleteSA releases it, and otherwise it expires
// after Options.SPIReservation.
func (db *DB) AllocSPI(lo, hi uint32) (uint32, error) {
	lo = max(lo, minSPI)
	if hi < lo {
		return 0, fmt.Errorf("sa: SPI range 0x%x-0x%x is empty (SPIs below 0x100 are reserved)", lo, hi)
	}
	d := &db.sadb
	d.mu.Lock()
	defer d.mu.Unlock()
	now := db.mono()
	db.expireReservations(now)
	used := func(spi uint32) bool {
		_, ok := d.inbound.get(u32Key(spi))
		return ok || d.larval[spi] != nil
	}
	size := uint64(hi-lo) + 1
	spi, found := uint32(0), false
	// While at most half the range can be taken, random draws find a free
	// SPI with probability at least 1/2 each; beyond that, scan.
	if taken := uint64(d.inbound.len() + len(d.larval)); size > 2*taken {
		for range 64 {
			if spi = lo + uint32(rand.Uint64N(size)); !used(spi) {
				found = true
				break
			}
		}
	}
	if !found {
		start := rand.Uint64N(size)
		for i := range size {
			if spi = lo + uint32((start+i)%size); !used(spi) {
				found = true
				break
			}
		}
	}
	if !found {
		return 0, fmt.Errorf("sa: %w in 0x%x-0x%x", ErrNoSPI, lo, hi)
	}
	l := &SA{db: db, spi: spi, dir: DirIn, addTime: now}
	l.refs.Store(refDead) // a reservation has no keys to hold
	l.params.Store(&params{cfg: Config{SPI: spi, Dir: DirIn}})
	d.addSeq++
	l.addSeq = d.addSeq
	d.larval[spi] = l
	return spi, nil
}

// expireReservations drops SPI reservations older than
// Options.SPIReservation. Called with sadb.mu held.
func (db *DB) expireReservations(now int64) {
	d := &db.sadb
	for spi, l := range d.larval {
		if now-l.addTime >= int64(db.opts.SPIReservation) {
			l.state.Store(uint32(StateDead))
			delete(d.larval, spi)
		}
	}
}
