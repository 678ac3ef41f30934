package daemon

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
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

var stateFileNames = [numStateFiles]string{"holds", "interfaces"}

// stateWrites counts the failed writes of each record.
type stateWrites struct {
	failed [numStateFiles]atomic.Uint64
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

var descStateWriteErrors = prometheus.NewDesc("espd_state_write_errors_total",
	"Failed writes of a record espd keeps in its state directory for the next boot (file: holds, the held prefixes; interfaces, the route-based interfaces): the next boot may restore an older record.",
	[]string{"file"}, nil)

// stateCollector exports espd_state_write_errors_total.
type stateCollector struct{ w *stateWrites }

// Describe implements prometheus.Collector.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descStateWriteErrors }

// Collect implements prometheus.Collector.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	for i, name := range stateFileNames {
		ch <- prometheus.MustNewConstMetric(descStateWriteErrors, prometheus.CounterValue, float64(c.w.failed[i].Load()), name)
	}
}
