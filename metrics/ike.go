package metrics

import (
	"reflect"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/espd/espd/conn"
)

// The IKE hand-off's series (espd --ike-handoff): the relay's counters
// (conn.IKEStats), exported as espd_ike_<name>_total, and the hub's
// espd_ike_undelivered_total. They are exported only while espd runs the
// hand-off: without it nothing can move them.

// ikeHelp says what increments each conn.IKEStats counter.
var ikeHelp = map[string]string{
	"Received":   "IKE datagrams the hand-off took in for the IKE daemon: every datagram on the IKE port, and the non-ESP-marked ones on the encapsulation port (which espd_dataplane_ike_total counts too).",
	"Sent":       "IKE datagrams the IKE daemon handed to espd (IKE_PACKET) that the kernel accepted to send.",
	"SendErrors": "IKE datagrams the IKE daemon handed to espd that the kernel refused to send (no route to the destination, for example).",
	"Refused":    "IKE datagrams the IKE daemon handed to espd that espd refused without trying to send them: an invalid destination, source and destination of different families, an empty or oversized datagram, IPv6 while it is off, a source port that is neither the IKE port nor the encapsulation port, or a datagram for the encapsulation port without the non-ESP marker (the IKE daemon cannot send ESP).",
	"ReadErrors": "Reads of the IKE port's sockets that failed.",
}

// IKE is what the IKE hand-off's series read.
type IKE struct {
	Relay       conn.IKEStats // the relay's counters, kept by the sockets after the hand-off stops
	Undelivered uint64        // datagrams the hub dropped (espd_ike_undelivered_total)
}

// descIKEUndelivered is the hub's count.
var descIKEUndelivered = prometheus.NewDesc("espd_ike_undelivered_total",
	"IKE datagrams of espd_ike_received_total dropped because they were longer than an IKE_PACKET message carries (65,492 bytes over IPv4, 65,468 over IPv6), no IKE daemon was registered for the hand-off or its queue was full.", nil, nil)

var ikeFields = counterFields[conn.IKEStats]("espd_ike_", ikeHelp)

// ikeCollector exports the hand-off's counters: the relay's and the
// hub's.
type ikeCollector struct {
	get func() IKE
}

// Describe implements prometheus.Collector.
func (c *ikeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, f := range ikeFields {
		ch <- f.desc
	}
	ch <- descIKEUndelivered
}

// Collect implements prometheus.Collector.
func (c *ikeCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.get()
	v := reflect.ValueOf(st.Relay)
	for _, f := range ikeFields {
		ch <- prometheus.MustNewConstMetric(f.desc, prometheus.CounterValue, float64(v.Field(f.field).Uint()))
	}
	ch <- prometheus.MustNewConstMetric(descIKEUndelivered, prometheus.CounterValue, float64(st.Undelivered))
}
