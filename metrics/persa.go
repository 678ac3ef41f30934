package metrics

import (
	"bufio"
	"runtime"
	"strconv"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/sa"
)

// Per-state families.
const (
	helpSAPackets = "# HELP espd_sa_packets_total Packets carried by the state.\n# TYPE espd_sa_packets_total counter\n"
	helpSABytes   = "# HELP espd_sa_bytes_total Inner bytes carried by the state.\n# TYPE espd_sa_bytes_total counter\n"
	helpSADrops   = "# HELP espd_sa_drops_total Packets of the state dropped, by reason (only reasons that dropped a packet of the state).\n# TYPE espd_sa_drops_total counter\n"
	helpOmitted   = "# HELP espd_metrics_states_omitted Live states without espd_sa_* series because of the per-state limit (--metrics-per-sa).\n# TYPE espd_metrics_states_omitted gauge\n"
)

// writePerSA writes the per-state families for the oldest m.perSA live
// states, and espd_metrics_states_omitted. The label sets are formatted
// once, into buffers kept from scrape to scrape; the counters are read
// as each line is written.
func (m *Handler) writePerSA(w *bufio.Writer) {
	all := m.db.SAs() // oldest first
	live := m.states[:0]
	for _, s := range all {
		if st := s.State(); st == sa.StateValid || st == sa.StateSoftExpired {
			live = append(live, s)
		}
	}
	omitted := max(len(live)-m.perSA, 0)
	live = live[:len(live)-omitted]
	if limited := omitted > 0; limited != m.limited {
		m.limited = limited
		if limited {
			m.log.Warn("per-state metrics limited: some states have no espd_sa_* series", "limit", m.perSA, "omitted", omitted)
		} else {
			m.log.Info("per-state metrics no longer limited", "limit", m.perSA, "states", len(live))
		}
	}

	m.labels, m.ends = m.labels[:0], m.ends[:0]
	for i, s := range live {
		m.labels, m.ends = m.appendLabels(m.labels, m.ends, s)
		yield(i)
	}

	w.WriteString(helpSAPackets)
	for i, s := range live {
		m.sample(w, "espd_sa_packets_total{", i, "", s.Stats().Packets)
		yield(i)
	}
	w.WriteString(helpSABytes)
	for i, s := range live {
		m.sample(w, "espd_sa_bytes_total{", i, "", s.Stats().Bytes)
		yield(i)
	}
	w.WriteString(helpSADrops)
	for i, s := range live {
		yield(i)
		st := s.Stats()
		for r, n := range st.Drops {
			if n != 0 {
				m.sample(w, "espd_sa_drops_total{", i, sa.DropReason(r).String(), n)
			}
		}
	}
	w.WriteString(helpOmitted)
	w.WriteString("espd_metrics_states_omitted ")
	m.line = strconv.AppendInt(m.line[:0], int64(omitted), 10)
	m.line = append(m.line, '\n')
	w.Write(m.line)

	// Keep the buffers for the next scrape, unless they are far larger
	// than this one needed; drop the pointers to the states.
	clear(live)
	m.states = live[:0]
	if cap(m.states) > 4*len(live)+1024 {
		m.states, m.labels, m.ends = nil, nil, nil
	}
}

// yieldEvery is how many states a per-state loop handles before it lets
// other goroutines run.
const yieldEvery = 256

// yield lets the data path's goroutines run every yieldEvery states: they
// share espd's Ps (GOMAXPROCS may be 1) with the scrape, and Go would
// otherwise preempt a busy scrape only every 10 ms. With its gzip
// compression (inline in the writes), a chunk takes well under a
// millisecond.
func yield(i int) {
	if i%yieldEvery == yieldEvery-1 {
		runtime.Gosched()
	}
}

// sample writes one sample line of the i-th state: name (ending in "{"),
// its labels, reason if not empty, value.
func (m *Handler) sample(w *bufio.Writer, name string, i int, reason string, v uint64) {
	start := uint32(0)
	if i > 0 {
		start = m.ends[2*i-1]
	}
	mid, end := m.ends[2*i], m.ends[2*i+1]
	b := append(m.line[:0], name...)
	if reason == "" {
		b = append(b, m.labels[start:end]...)
	} else {
		b = append(b, m.labels[start:mid]...)
		b = append(b, `,reason="`...)
		b = append(b, reason...)
		b = append(b, '"')
		b = append(b, m.labels[mid:end]...)
	}
	b = append(b, "} "...)
	b = strconv.AppendUint(b, v, 10)
	b = append(b, '\n')
	w.Write(b)
	m.line = b
}

// appendLabels appends the label set of s (names sorted, as the client
// library writes them), and the ends of its two halves, around where
// reason goes.
func (m *Handler) appendLabels(b []byte, ends []uint32, s *sa.SA) ([]byte, []uint32) {
	b = append(b, `dir="`...)
	b = appendLabelValue(b, s.Dir().String())
	b = append(b, `",dst="`...)
	b = s.Config().Dst.AppendTo(b)
	b = append(b, '"')
	ends = append(ends, uint32(len(b)))
	b = append(b, `,reqid="`...)
	b = strconv.AppendUint(b, uint64(s.ReqID()), 10)
	b = append(b, `",spi="0x`...)
	spi := s.SPI()
	for shift := 28; shift >= 0; shift -= 4 {
		b = append(b, "0123456789abcdef"[spi>>shift&0xf])
	}
	b = append(b, `",suite="`...)
	b = appendLabelValue(b, m.suiteName(s.Suite()))
	b = append(b, '"')
	return b, append(ends, uint32(len(b)))
}

// suiteName returns s.String(), cached.
func (m *Handler) suiteName(s crypto.Suite) string {
	for _, n := range m.suites {
		if n.s == s {
			return n.name
		}
	}
	if len(m.suites) >= 64 {
		m.suites = m.suites[:0]
	}
	n := suiteName{s, s.String()}
	m.suites = append(m.suites, n)
	return n.name
}

// appendLabelValue appends v escaped for a label value of the text
// format.
func appendLabelValue(b []byte, v string) []byte {
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '\\':
			b = append(b, `\\`...)
		case '"':
			b = append(b, `\"`...)
		case '\n':
			b = append(b, `\n`...)
		default:
			b = append(b, c)
		}
	}
	return b
}
