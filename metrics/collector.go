package metrics

import (
	"reflect"
	"strings"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/sa"
)

// collector exports the series whose number does not depend on the number
// of states: the SA database's (sa.GlobalStats) and the data path's
// (dataplane.Stats). Each counter is exported once, from the one place
// that counts it.
type collector struct {
	db  *sa.DB
	dp  func() dataplane.Stats
	aes bool // Sources.AES
}

// The SA database's series (sa.DB.Stats).
var (
	descStates = prometheus.NewDesc("espd_states",
		"States (SAs) installed now; SPI reservations are espd_spi_reservations.", nil, nil)
	descReserved = prometheus.NewDesc("espd_spi_reservations",
		"SPIs reserved by SPI_ALLOC (espctl spi alloc) that no state uses yet.", nil, nil)
	descPolicies = prometheus.NewDesc("espd_policies", "Policies installed now.", nil, nil)
	descPackets  = prometheus.NewDesc("espd_packets_total",
		"Packets states carried (encapsulated and handed to the sockets, or decapsulated and handed to the TUN), summed over every state, removed ones included.", nil, nil)
	descBytes = prometheus.NewDesc("espd_bytes_total",
		"Inner bytes of the packets in espd_packets_total.", nil, nil)
	descDrops = prometheus.NewDesc("espd_drops_total",
		"Packets a state dropped, by reason, summed over every state, removed ones included (the data path's drops before a state is found are espd_dataplane_*).", []string{"reason"}, nil)
	descAcquires = prometheus.NewDesc("espd_acquires_total",
		"Acquire events published: an outbound packet matched a protect policy whose reqid had no live state, and the rate limits (one per policy and destination a second, 100 a second in all) let the event through (each such packet is in espd_dataplane_no_sa_total: the difference is what the rate limits held back).", nil, nil)
	descCPUAES = prometheus.NewDesc("espd_cpu_aes",
		"1 if the CPU has the AES instructions Go's AES uses, 0 if AES suites run slowly and not in constant time here.", nil, nil)
	descEventsDropped = prometheus.NewDesc("espd_events_dropped_total",
		"Events (expiries, acquires, NAT mapping changes) not delivered to a control subscriber because its buffer was full, one per event and subscriber.", nil, nil)
)

// dataplaneHelp says what increments each dataplane.Stats counter,
// exported as espd_dataplane_<name>_total (snake case).
var dataplaneHelp = map[string]string{
	"TUNRxPackets":     "Packets read from the TUN (each packet of a super-packet counts).",
	"TUNRxBytes":       "Bytes of the packets in espd_dataplane_tun_rx_packets_total.",
	"TUNTxPackets":     "Packets handed to the TUN: decapsulated packets and the ICMP errors the data path writes.",
	"TUNTxBytes":       "Bytes of the packets in espd_dataplane_tun_tx_packets_total.",
	"TUNQueueDrops":    "Packets the kernel routed into the TUN and dropped because its transmit queue (--tun-txqueuelen) was full: espd had not read them yet (the interface's tx_dropped).",
	"RxPackets":        "Outer packets received from the sockets (ESP, ESP-in-UDP, NAT-keepalives, IKE, malformed).",
	"RxBytes":          "ESP (or UDP payload) bytes of the outer packets received that could be read.",
	"TxPackets":        "Outer packets handed to the sockets, each fragment and NAT-keepalive included.",
	"TxBytes":          "Bytes of the packets in espd_dataplane_tx_packets_total, IP headers included.",
	"NoPolicy":         "Outbound packets no outbound policy matches (dropped).",
	"BypassInTUN":      "Outbound packets a bypass policy matches, dropped: bypass does not apply inside the TUN.",
	"PolicyDrops":      "Outbound packets an outbound drop policy matches (dropped).",
	"NoSA":             "Outbound packets a protect policy matches while its reqid has no live state (dropped; each asks for an acquire).",
	"ICMPSent":         "ICMP fragmentation-needed or packet-too-big errors written to the TUN for packets too big for the path.",
	"ICMPLimited":      "ICMP errors for packets too big for the path that the rate limit suppressed.",
	"Fragments":        "Outer fragments sent (an outer packet split in k counts k).",
	"InvalidSPI":       "Inbound ESP packets whose SPI no live inbound state has (dropped).",
	"Malformed":        "Outer packets, or packets read from the TUN, that cannot be parsed far enough to find their state or policy (dropped).",
	"KeepalivesRx":     "NAT-keepalives received (and dropped).",
	"KeepalivesTx":     "NAT-keepalives sent.",
	"IKE":              "Non-ESP (IKE) datagrams received on the encapsulation port.",
	"NoInterface":      "Inbound packets of a state whose interface ID (if_id) has no route-based interface (dropped before decryption).",
	"QueueDrops":       "Packets dropped because the workers' queue was full.",
	"SendErrors":       "Outer packets the kernel refused to send.",
	"TUNWriteErrors":   "Writes to the TUN (of a batch of packets, or of one ICMP error) that failed.",
	"ReadErrors":       "Reads from the TUN or the outer sockets that failed.",
	"TUNReads":         "Successful read(2) calls on the TUN.",
	"TUNSuperReads":    "TUN reads that returned a TSO/USO super-packet.",
	"TUNWrites":        "Writes of packets and coalesced super-packets to the TUN, each one writev(2) or one io_uring submission (a Write of several takes one io_uring_enter).",
	"TUNUringEnters":   "io_uring_enter calls through which the TUN writes of a batch were submitted together (none with --tun-no-uring or where io_uring is refused).",
	"TUNSuperWrites":   "TUN writes of a coalesced super-packet.",
	"RecvCalls":        "recvmmsg calls on the outer sockets that returned datagrams.",
	"RecvDatagrams":    "Datagrams those recvmmsg calls returned (a UDP_GRO datagram counts once).",
	"SendCalls":        "sendmmsg calls on the outer sockets that sent messages.",
	"SendMessages":     "Messages those sendmmsg calls sent (a UDP_SEGMENT message counts once).",
	"CompletedBatches": "Batches a reader ran to completion itself.",
	"HandedOff":        "Batches a reader handed to the workers.",
}

// dpSeries is one exported counter of a struct of counters
// (dataplane.Stats, conn.IKEStats).
type dpSeries struct {
	field int // index in the struct
	desc  *prometheus.Desc
}

var dpFields = counterFields[dataplane.Stats]("espd_dataplane_", dataplaneHelp)

// counterFields describes the counters of the struct T as
// <prefix><name>_total, with the help texts of help by field name. A
// counter without help is exported with its Go name as help; the tests
// fail on it.
func counterFields[T any](prefix string, help map[string]string) []dpSeries {
	t := reflect.TypeFor[T]()
	var out []dpSeries
	for i := range t.NumField() {
		f := t.Field(i)
		h, ok := help[f.Name]
		if !ok {
			h = t.String() + "." + f.Name
		}
		out = append(out, dpSeries{i, prometheus.NewDesc(prefix+snake(f.Name)+"_total", h, nil, nil)})
	}
	return out
}

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
	for _, d := range []*prometheus.Desc{descStates, descReserved, descPolicies, descPackets, descBytes, descDrops,
		descAcquires, descEventsDropped, descCPUAES} {
		ch <- d
	}
	for _, f := range dpFields {
		ch <- f.desc
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	counter, gauge := prometheus.CounterValue, prometheus.GaugeValue
	g := c.db.Stats()
	ch <- prometheus.MustNewConstMetric(descStates, gauge, float64(g.States))
	ch <- prometheus.MustNewConstMetric(descReserved, gauge, float64(g.Larval))
	ch <- prometheus.MustNewConstMetric(descPolicies, gauge, float64(g.Policies))
	ch <- prometheus.MustNewConstMetric(descPackets, counter, float64(g.Packets))
	ch <- prometheus.MustNewConstMetric(descBytes, counter, float64(g.Bytes))
	for r, n := range g.Drops {
		ch <- prometheus.MustNewConstMetric(descDrops, counter, float64(n), sa.DropReason(r).String())
	}
	ch <- prometheus.MustNewConstMetric(descAcquires, counter, float64(g.Acquires))
	ch <- prometheus.MustNewConstMetric(descEventsDropped, counter, float64(g.EventsDropped))
	aes := 0.0
	if c.aes {
		aes = 1
	}
	ch <- prometheus.MustNewConstMetric(descCPUAES, gauge, aes)
	dv := reflect.ValueOf(c.dp())
	for _, f := range dpFields {
		ch <- prometheus.MustNewConstMetric(f.desc, counter, float64(dv.Field(f.field).Uint()))
	}
}
