package metrics

import "github.com/prometheus/client_golang/prometheus"

var descStateWriteErrors = prometheus.NewDesc("espd_state_write_errors_total",
	"Failed writes of a record espd keeps in its state directory for the next boot (file: holds, the held prefixes; interfaces, the route-based interfaces): the next boot may restore an older record.",
	[]string{"file"}, nil)

// StateWrites counts the failed writes of each record espd keeps in its
// state directory for the next boot.
type StateWrites struct {
	Holds      uint64 // the held prefixes (file "holds")
	Interfaces uint64 // the route-based interfaces (file "interfaces")
}

// stateCollector exports espd_state_write_errors_total.
type stateCollector struct{ get func() StateWrites }

// Describe implements prometheus.Collector.
func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descStateWriteErrors }

// Collect implements prometheus.Collector.
func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	w := c.get()
	ch <- prometheus.MustNewConstMetric(descStateWriteErrors, prometheus.CounterValue, float64(w.Holds), "holds")
	ch <- prometheus.MustNewConstMetric(descStateWriteErrors, prometheus.CounterValue, float64(w.Interfaces), "interfaces")
}
