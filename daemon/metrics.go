package daemon

import (
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/sa"
)

// metricsHandler serves /metrics. Every value is read from the counters the
// data path keeps anyway, at scrape time: metrics cost nothing per packet.
func (d *Daemon) metricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(&collector{d: d})
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}

// collector exports per-state and global counters.
type collector struct{ d *Daemon }

var (
	saLabels      = []string{"spi", "dst", "dir", "reqid", "suite"}
	descSAPackets = prometheus.NewDesc("espd_sa_packets_total", "Packets carried by the state.", saLabels, nil)
	descSABytes   = prometheus.NewDesc("espd_sa_bytes_total", "Inner bytes carried by the state.", saLabels, nil)
	descSADrops   = prometheus.NewDesc("espd_sa_drops_total", "Packets of the state dropped, by reason.", append(saLabels[:len(saLabels):len(saLabels)], "reason"), nil)
	descStates    = prometheus.NewDesc("espd_states", "Installed states (SAs).", nil, nil)
	descPolicies  = prometheus.NewDesc("espd_policies", "Installed policies.", nil, nil)
	descDrops     = prometheus.NewDesc("espd_drops_total", "Packets of all states dropped, by reason (removed states included).", []string{"reason"}, nil)
	descGlobal    = map[string]*prometheus.Desc{}
	dpFields      = dataplaneFields()
)

// dataplaneFields describes every counter of dataplane.Stats as
// espd_dataplane_<name>_total.
func dataplaneFields() []*prometheus.Desc {
	t := reflect.TypeOf(dataplane.Stats{})
	descs := make([]*prometheus.Desc, t.NumField())
	for i := range descs {
		f := t.Field(i)
		descs[i] = prometheus.NewDesc("espd_dataplane_"+snake(f.Name)+"_total", "Data plane counter "+f.Name+" (see dataplane.Stats).", nil, nil)
	}
	return descs
}

// globalDesc returns the descriptor of a sa.GlobalStats counter.
func globalDesc(name, help string) *prometheus.Desc {
	if d, ok := descGlobal[name]; ok {
		return d
	}
	d := prometheus.NewDesc("espd_"+name+"_total", help, nil, nil)
	descGlobal[name] = d
	return d
}

var (
	descInvalidSPI    = globalDesc("invalid_spi", "ESP packets whose SPI matches no state.")
	descMalformed     = globalDesc("malformed", "Packets that could not be parsed.")
	descPolicyDrops   = globalDesc("policy_drops", "Packets dropped by a policy (drop action, or no matching policy).")
	descNoState       = globalDesc("no_state", "Packets of a protect policy without a state.")
	descQueueDrops    = globalDesc("queue_drops", "Packets dropped because a queue was full.")
	descAcquires      = globalDesc("acquires", "Acquire events fired.")
	descEventsDropped = globalDesc("events_dropped", "Events lost to slow subscribers.")
)

// snake turns "TUNRxPackets" into "tun_rx_packets".
func snake(s string) string {
	var b strings.Builder
	r := []rune(s)
	for i, c := range r {
		if unicode.IsUpper(c) && i > 0 && (unicode.IsLower(r[i-1]) || (i+1 < len(r) && unicode.IsLower(r[i+1]))) {
			b.WriteByte('_')
		}
		b.WriteRune(unicode.ToLower(c))
	}
	return b.String()
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSAPackets, descSABytes, descSADrops, descStates, descPolicies, descDrops} {
		ch <- d
	}
	for _, d := range descGlobal {
		ch <- d
	}
	for _, d := range dpFields {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	counter := prometheus.CounterValue
	for _, s := range c.d.db.SAs() {
		st := s.Stats()
		cfg := s.Config()
		labels := []string{fmt.Sprintf("0x%08x", s.SPI()), cfg.Dst.String(), s.Dir().String(), fmt.Sprint(s.ReqID()), s.Suite().String()}
		ch <- prometheus.MustNewConstMetric(descSAPackets, counter, float64(st.Packets), labels...)
		ch <- prometheus.MustNewConstMetric(descSABytes, counter, float64(st.Bytes), labels...)
		for r, n := range st.Drops {
			ch <- prometheus.MustNewConstMetric(descSADrops, counter, float64(n), append(labels, sa.DropReason(r).String())...)
		}
	}
	g := c.d.db.Stats()
	ch <- prometheus.MustNewConstMetric(descStates, prometheus.GaugeValue, float64(g.States))
	ch <- prometheus.MustNewConstMetric(descPolicies, prometheus.GaugeValue, float64(g.Policies))
	for r, n := range g.Drops {
		ch <- prometheus.MustNewConstMetric(descDrops, counter, float64(n), sa.DropReason(r).String())
	}
	for d, v := range map[*prometheus.Desc]uint64{
		descInvalidSPI: g.InvalidSPI, descMalformed: g.Malformed, descPolicyDrops: g.PolicyDrops,
		descNoState: g.NoState, descQueueDrops: g.QueueDrops, descAcquires: g.Acquires, descEventsDropped: g.EventsDropped,
	} {
		ch <- prometheus.MustNewConstMetric(d, counter, float64(v))
	}
	dv := reflect.ValueOf(c.d.dp.Stats())
	for i, desc := range dpFields {
		ch <- prometheus.MustNewConstMetric(desc, counter, float64(dv.Field(i).Uint()))
	}
}
