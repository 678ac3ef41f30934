package daemon

import (
	"sync/atomic"

	"github.com/espd/espd/metrics"
)

// The records espd keeps in its state directory for the next boot whose
// writes can fail: the hold file (HoldFile) and the record of the
// route-based interfaces (InterfacesFile). A failed write is logged at
// error level and counted in espd_state_write_errors_total{file}; at
// start-up it stops espd (the unit fails), in a reload it is the reload's
// error.
const (
	stateFileHolds = iota
	stateFileInterfaces
	numStateFiles
)

// stateWrites counts the failed writes of each record.
type stateWrites struct {
	failed [numStateFiles]atomic.Uint64
}

// snapshot returns the counts for the metrics.
func (w *stateWrites) snapshot() metrics.StateWrites {
	return metrics.StateWrites{Holds: w.failed[stateFileHolds].Load(), Interfaces: w.failed[stateFileInterfaces].Load()}
}

// stateWriteFailed logs and counts a failed write of a record.
func (d *Daemon) stateWriteFailed(file int, err error) {
	d.writes.failed[file].Add(1)
	switch file {
	case stateFileHolds:
		d.log.Error("cannot record the held prefixes for the next boot; they stay held now", "err", err)
	default:
		d.log.Error("cannot record the route-based interfaces for the next boot; they exist now", "err", err)
	}
}
