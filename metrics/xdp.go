package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/espd/espd/conn/afxdp"
)

// The AF_XDP path's series, exported when --xdp names devices.
var (
	descXDPFallback = prometheus.NewDesc("espd_xdp_fallback",
		"1 if --xdp names devices but the AF_XDP path could not be opened (espd receives through the sockets alone; the log says why), else 0.", nil, nil)
	descXDPDevices = prometheus.NewDesc("espd_xdp_devices",
		"Devices whose ESP espd receives through AF_XDP, by attach mode (native or generic).", []string{"mode"}, nil)
	descXDPFrames = prometheus.NewDesc("espd_xdp_frames_total",
		"Frames the AF_XDP receivers took (each also counts in espd_dataplane_rx_packets_total).", nil, nil)
	descXDPDropped = prometheus.NewDesc("espd_xdp_dropped_total",
		"Frames the kernel dropped on their way to an AF_XDP receiver for want of a free frame or ring entry (XDP_STATISTICS).", nil, nil)
)

// xdpCollector exports the AF_XDP path's series; path is nil after a
// fallback.
type xdpCollector struct {
	path *afxdp.Path
}

// Describe implements prometheus.Collector.
func (c *xdpCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descXDPFallback, descXDPDevices, descXDPFrames, descXDPDropped} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *xdpCollector) Collect(ch chan<- prometheus.Metric) {
	gauge, counter := prometheus.GaugeValue, prometheus.CounterValue
	fallback := 1.0
	modes := map[string]float64{"native": 0, "generic": 0}
	var st afxdp.Stats
	if c.path != nil {
		fallback = 0
		for _, a := range c.path.Attached() {
			modes[a.Mode]++
		}
		st = c.path.Stats()
	}
	ch <- prometheus.MustNewConstMetric(descXDPFallback, gauge, fallback)
	for m, n := range modes {
		ch <- prometheus.MustNewConstMetric(descXDPDevices, gauge, n, m)
	}
	ch <- prometheus.MustNewConstMetric(descXDPFrames, counter, float64(st.Frames))
	ch <- prometheus.MustNewConstMetric(descXDPDropped, counter, float64(st.Dropped))
}
