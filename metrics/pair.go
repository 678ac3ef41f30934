package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/espd/espd/pairsync"
)

// The gateway pair's series (espd --pair-node): the node's role, when the
// other node was last heard, the pair link's counters (pairsync.Stats)
// and what the last takeover did. They are exported only with a pair.
// espd_pair_peer_heard_seconds is absent until the other node has been
// heard: a gauge with no value to give is left out rather than given a
// made-up one.
var (
	descPairRole = prometheus.NewDesc("espd_pair_role",
		"This node's role in the gateway pair: 1 active, 2 standby (set with PAIR_ROLE, espctl pair role; espd starts as standby).", nil, nil)
	descPairPeerHeard = prometheus.NewDesc("espd_pair_peer_heard_seconds",
		"Seconds since an authentic message of the other node last arrived on the pair link; absent until one has.", nil, nil)
	descPairSent = prometheus.NewDesc("espd_pair_messages_sent_total",
		"Messages this node sent on the pair link, by type: reserve (an active's reservations: before it uses one, resent until acknowledged, and all of them every sweep interval), ack (a standby's, one per reserve it recorded), windows (an active's inbound replay windows, every sweep interval), hello (a standby's, every half interval), own (a standby's own reservations, the most it may have sent, every sweep interval); counted when encoded, so sends that failed are included.", []string{"type"}, nil)
	descPairReceived = prometheus.NewDesc("espd_pair_messages_received_total",
		"Messages accepted on the pair link, by type (as for espd_pair_messages_sent_total), split-brain ones included; replayed, reflected and misconfigured ones are counted apart.", []string{"type"}, nil)
	descPairSentBytes = prometheus.NewDesc("espd_pair_sent_bytes_total",
		"Bytes of the messages in espd_pair_messages_sent_total (UDP payload).", nil, nil)
	descPairRecvBytes = prometheus.NewDesc("espd_pair_received_bytes_total",
		"Bytes of the messages in espd_pair_messages_received_total (UDP payload).", nil, nil)
	descPairSendErrors = prometheus.NewDesc("espd_pair_send_errors_total",
		"Messages of espd_pair_messages_sent_total that the kernel refused to send on the pair link.", nil, nil)
	descPairRejected = prometheus.NewDesc("espd_pair_rejected_total",
		"Datagrams received on the pair link and dropped because they are not authentic under the other node's key, are malformed (an unknown version or type included) or come from another address.", nil, nil)
	descPairReflected = prometheus.NewDesc("espd_pair_reflected_total",
		"Datagrams dropped because they are this node's own messages sent back to it (authentic under its own direction's key).", nil, nil)
	descPairReplayed = prometheus.NewDesc("espd_pair_replayed_total",
		"Authentic messages dropped because they are not newer than what was accepted: replayed, reordered, delayed, or of an earlier run of the other node.", nil, nil)
	descPairMisconfigured = prometheus.NewDesc("espd_pair_misconfigured_total",
		"Authentic messages refused because the other node claims this node's number, or has other parameters (block size, interval, lease, link addresses) or own addresses that are this node's; the log says which.", nil, nil)
	descPairForgotten = prometheus.NewDesc("espd_pair_forgotten_total",
		"Keys of the other node this node forgot (memory and store record) because its reports no longer carried them: their states are gone.", nil, nil)
	descPairSplitBrain = prometheus.NewDesc("espd_pair_split_brain_total",
		"Reserve and windows messages received while this node was active (dropped): the other node acts as active too.", nil, nil)
	descPairLeaseWaits = prometheus.NewDesc("espd_pair_lease_waits_total",
		"Reservations this active node used without the standby's acknowledgement, once the lease had run out (the lease and a tenth after the standby was last heard).", nil, nil)
	descPairAckWaits = prometheus.NewDesc("espd_pair_ack_waits_total",
		"Reservations this active node sent to the standby and used once it acknowledged them.", nil, nil)
	descPairRecordErrors = prometheus.NewDesc("espd_pair_record_errors_total",
		"Reservations of the other node this node's sequence-number store refused: they are not acknowledged (the active uses them on the lease) and their key is not fresh; the others are recorded.", nil, nil)
	descPairReleased = prometheus.NewDesc("espd_pair_takeover_released",
		"Outbound states the last takeover (role active) released: they continue above the other node's fresh report; 0 while standing by.", nil, nil)
	descPairSilent = prometheus.NewDesc("espd_pair_takeover_silent",
		"Outbound states the last takeover left silent (no fresh report, every sequence number used, or the store failed) until rekeyed; 0 while standing by.", nil, nil)
	descPairStale = prometheus.NewDesc("espd_pair_takeover_stale_windows",
		"Inbound states the last takeover found without a fresh replay window report: soft-expired so that charon rekeys them (docs/ha.md); 0 while standing by.", nil, nil)
)

// Pair is what the gateway pair's series read.
type Pair struct {
	Role pairsync.Role
	// Heard is how long ago an authentic message of the other node last
	// arrived, if HeardOK: one has.
	Heard   time.Duration
	HeardOK bool
	Link    pairsync.Stats // the pair link's counters
	// What the last takeover did: outbound states released and left
	// silent, inbound states without a fresh replay window.
	Released, Silent, Stale int
}

// pairSentTypes are the types a node sends; index 0 of pairsync.Stats'
// arrays (other types) is not exported: Decode refuses an unknown type,
// which counts in espd_pair_rejected_total instead.
var pairSentTypes = []pairsync.Type{pairsync.TypeReserve, pairsync.TypeAck, pairsync.TypeWindows, pairsync.TypeHello, pairsync.TypeOwn}

// pairCollector exports the gateway pair's series.
type pairCollector struct {
	get func() Pair
}

// Describe implements prometheus.Collector.
func (c *pairCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPairRole, descPairPeerHeard, descPairSent, descPairReceived,
		descPairSentBytes, descPairRecvBytes, descPairSendErrors, descPairRejected, descPairReflected, descPairReplayed, descPairMisconfigured, descPairForgotten, descPairSplitBrain,
		descPairLeaseWaits, descPairAckWaits, descPairRecordErrors, descPairReleased, descPairSilent, descPairStale} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *pairCollector) Collect(ch chan<- prometheus.Metric) {
	counter, gauge := prometheus.CounterValue, prometheus.GaugeValue
	p := c.get()
	ch <- prometheus.MustNewConstMetric(descPairRole, gauge, float64(p.Role))
	if p.HeardOK {
		ch <- prometheus.MustNewConstMetric(descPairPeerHeard, gauge, p.Heard.Seconds())
	}
	st := p.Link
	for _, t := range pairSentTypes {
		ch <- prometheus.MustNewConstMetric(descPairSent, counter, float64(st.Sent[t]), t.String())
		ch <- prometheus.MustNewConstMetric(descPairReceived, counter, float64(st.Received[t]), t.String())
	}
	ch <- prometheus.MustNewConstMetric(descPairSentBytes, counter, float64(st.SentBytes))
	ch <- prometheus.MustNewConstMetric(descPairRecvBytes, counter, float64(st.RecvBytes))
	ch <- prometheus.MustNewConstMetric(descPairSendErrors, counter, float64(st.SendErrors))
	ch <- prometheus.MustNewConstMetric(descPairRejected, counter, float64(st.Rejected))
	ch <- prometheus.MustNewConstMetric(descPairReflected, counter, float64(st.Reflected))
	ch <- prometheus.MustNewConstMetric(descPairReplayed, counter, float64(st.Replayed))
	ch <- prometheus.MustNewConstMetric(descPairMisconfigured, counter, float64(st.Misconfigured))
	ch <- prometheus.MustNewConstMetric(descPairForgotten, counter, float64(st.Forgotten))
	ch <- prometheus.MustNewConstMetric(descPairSplitBrain, counter, float64(st.SplitBrain))
	ch <- prometheus.MustNewConstMetric(descPairLeaseWaits, counter, float64(st.LeaseWaits))
	ch <- prometheus.MustNewConstMetric(descPairAckWaits, counter, float64(st.AckWaits))
	ch <- prometheus.MustNewConstMetric(descPairRecordErrors, counter, float64(st.RecordErrors))
	ch <- prometheus.MustNewConstMetric(descPairReleased, gauge, float64(p.Released))
	ch <- prometheus.MustNewConstMetric(descPairSilent, gauge, float64(p.Silent))
	ch <- prometheus.MustNewConstMetric(descPairStale, gauge, float64(p.Stale))
}
