// Package report holds the benchmark harness's results (every run, as
// written to the JSON file) and turns them into the tables and the chart:
// medians with their range, retransmits and CPU cost per gigabyte.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"time"
)

// Kinds of measurement.
const (
	KindTCP  = "tcp"  // TCP bulk goodput at an MSS
	KindUDP  = "udp"  // small-datagram packet rate
	KindPing = "ping" // round-trip time over an idle tunnel
)

// Machine describes where the numbers were measured.
type Machine struct {
	CPU        string   `json:"cpu"`
	Cores      int      `json:"cores"`
	Kernel     string   `json:"kernel"`
	Go         string   `json:"go"`
	Hypervisor string   `json:"hypervisor,omitempty"`
	CPUFlags   []string `json:"cpu_flags,omitempty"` // the crypto-relevant ones present
}

// System describes one compared system and what became of it.
type System struct {
	Name     string `json:"name"`
	Label    string `json:"label"`
	PerSuite bool   `json:"per_suite"`
	// Cipher is what a system that is not keyed per suite encrypts with.
	Cipher string `json:"cipher,omitempty"`
	// Skipped, if set, says why the system did not run at all.
	Skipped string `json:"skipped,omitempty"`
	// Unavailable maps a suite to the reason the system cannot carry it
	// here; Failed maps a suite ("" for all) to an error that stopped it.
	Unavailable map[string]string `json:"unavailable,omitempty"`
	Failed      map[string]string `json:"failed,omitempty"`
	// Version is the binary the system ran, where it matters.
	Version string `json:"version,omitempty"`
	// Drivers maps a suite to the kernel crypto driver the system's
	// states used, read from /proc/crypto after keying (kernel XFRM).
	Drivers map[string]string `json:"drivers,omitempty"`
	// Group is the rows the system belongs to in the tables, and what its
	// label starts with: "" for the gateways (client -> server), or
	// another group measured elsewhere ("host to host, transport mode":
	// gwA -> gwB, the hosts' own traffic), whose rows follow the
	// gateways'.
	Group string `json:"group,omitempty"`
}

// CPU is the CPU time spent over one run's measured window, in seconds.
type CPU struct {
	// GwA and GwB: utime+stime of the gateway's data-plane processes.
	GwA float64 `json:"gw_a"`
	GwB float64 `json:"gw_b"`
	// Generator: the traffic generator's own process (the harness itself
	// with the built-in generator; not measured with iperf3).
	Generator float64 `json:"generator"`
	// HostBusy and HostSoftirq: the whole machine (/proc/stat: user,
	// nice, system, irq, softirq; and softirq alone).
	HostBusy    float64 `json:"host_busy"`
	HostSoftirq float64 `json:"host_softirq"`
	// Ksoftirqd: the softirq kernel threads.
	Ksoftirqd float64 `json:"ksoftirqd"`
}

// SACounters are a tunnel's own packet counts over one run.
type SACounters struct {
	OutPackets uint64 `json:"out_packets"`
	InPackets  uint64 `json:"in_packets"`
	InDrops    uint64 `json:"in_drops"`
}

// Run is one measurement.
type Run struct {
	System string `json:"system"`
	// Suite is the ESP suite; empty for systems with their own cipher.
	Suite string `json:"suite,omitempty"`
	Kind  string `json:"kind"`
	// MSS is the TCP MSS asked for; 0 is the path's maximum.
	MSS int `json:"mss"`
	// Rep counts the repetitions of the point from 1; Block is the suite
	// block (0-based) the run happened in; Seq its place in the run.
	Rep   int       `json:"rep"`
	Block int       `json:"block"`
	Seq   int       `json:"seq"`
	Start time.Time `json:"start"`

	// TCP: goodput over the window, retransmits in it, the MSS seen.
	BitsPerSecond float64 `json:"bits_per_second,omitempty"`
	Bytes         int64   `json:"bytes,omitempty"`
	Seconds       float64 `json:"seconds,omitempty"`
	Retransmits   uint32  `json:"retransmits"`
	MSSSeen       uint32  `json:"mss_seen,omitempty"`
	// UDP: datagrams per second received, and the counts.
	PacketsPerSecond float64 `json:"packets_per_second,omitempty"`
	Sent             uint64  `json:"sent,omitempty"`
	Received         uint64  `json:"received,omitempty"`
	PayloadSize      int     `json:"payload_size,omitempty"`
	// Ping: round-trip times in microseconds.
	RTTMinUs float64 `json:"rtt_min_us,omitempty"`
	RTTAvgUs float64 `json:"rtt_avg_us,omitempty"`
	RTTMaxUs float64 `json:"rtt_max_us,omitempty"`
	// Hops: where the round trip went (-ping-hops), medians over the run.
	Hops *Hops `json:"hops,omitempty"`

	CPU *CPU        `json:"cpu,omitempty"`
	SA  *SACounters `json:"sa,omitempty"`
	// Scale: the scale point and reordering of a KindScale run.
	Scale *ScaleRun `json:"scale,omitempty"`
	// Error is why the run failed; a failed run counts in no median.
	Error string `json:"error,omitempty"`
}

// OK reports whether the run succeeded.
func (r Run) OK() bool { return r.Error == "" }

// Report is a whole harness run.
type Report struct {
	// Emulated, if set, says that the run was made under emulation and
	// what that means for its figures; the tables and the chart carry it.
	Emulated string    `json:"emulated,omitempty"`
	Machine  Machine   `json:"machine"`
	Command  string    `json:"command"`
	Tool     string    `json:"tool"`
	Family   string    `json:"family"`
	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	// Duration and Omit are the measured window and the warm-up before
	// it, per run.
	Duration    string   `json:"duration"`
	Omit        string   `json:"omit"`
	UDPDuration string   `json:"udp_duration,omitempty"`
	Reps        int      `json:"reps"`
	Suites      []string `json:"suites"`
	MSS         []int    `json:"mss"`
	UDP         bool     `json:"udp"`
	Ping        bool     `json:"ping"`
	Systems     []System `json:"systems"`
	Runs        []Run    `json:"runs"`
	// ScalePoints are the scale measurement's points (scale mode).
	ScalePoints []ScalePoint `json:"scale_points,omitempty"`
}

// WriteJSON writes the report, indented.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// ReadJSON reads a report written by WriteJSON.
func ReadJSON(path string) (*Report, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r, err := ParseJSON(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// ParseJSON parses a report written by WriteJSON.
func ParseJSON(b []byte) (*Report, error) {
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	return &r, nil
}

// System returns the description of the named system.
func (r *Report) System(name string) (System, bool) {
	for _, s := range r.Systems {
		if s.Name == name {
			return s, true
		}
	}
	return System{}, false
}

// Key names a cell: a system at a point.
type Key struct {
	System, Suite, Kind string
	MSS                 int
}

// Stat summarizes a cell's successful runs.
type Stat struct {
	N, Failed        int
	Median, Min, Max float64
	// Retransmits is the median of the runs' retransmits (TCP).
	Retransmits float64
	// CPUA, CPUB: median CPU seconds per GB on each gateway; Softirq:
	// median machine softirq seconds per GB; Host: median machine busy
	// seconds per GB (TCP and UDP).
	CPUA, CPUB, Softirq, Host float64
	HasCPU                    bool
	// LastError is the error of the last failed run.
	LastError string
}

// value is the run's headline number for its kind.
func value(r Run) float64 {
	switch r.Kind {
	case KindTCP, KindScale:
		return r.BitsPerSecond
	case KindUDP:
		return r.PacketsPerSecond
	default:
		return r.RTTAvgUs
	}
}

// gb returns the gigabytes (1e9 bytes) a run moved: TCP goodput, or UDP
// payload.
func gb(r Run) float64 {
	if r.Kind == KindUDP {
		return float64(r.Received) * float64(r.PayloadSize) / 1e9
	}
	return float64(r.Bytes) / 1e9
}

// Median returns the median of v (the mean of the middle two for an even
// count); 0 for none.
func Median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Stat summarizes the runs of a cell. For systems with their own cipher
// the suite is ignored.
func (r *Report) Stat(k Key) Stat {
	var st Stat
	var vals, retr, ca, cb, sirq, host []float64
	for _, run := range r.Runs {
		if run.System != k.System || run.Kind != k.Kind || (k.Kind == KindTCP && run.MSS != k.MSS) {
			continue
		}
		if sys, ok := r.System(k.System); (!ok || sys.PerSuite) && run.Suite != k.Suite {
			continue
		}
		if !run.OK() {
			st.Failed++
			st.LastError = run.Error
			continue
		}
		v := value(run)
		vals = append(vals, v)
		retr = append(retr, float64(run.Retransmits))
		if run.CPU != nil && gb(run) > 0 {
			g := gb(run)
			ca = append(ca, run.CPU.GwA/g)
			cb = append(cb, run.CPU.GwB/g)
			sirq = append(sirq, run.CPU.HostSoftirq/g)
			host = append(host, run.CPU.HostBusy/g)
		}
	}
	st.N = len(vals)
	if st.N == 0 {
		return st
	}
	st.Median, st.Min, st.Max = Median(vals), slices.Min(vals), slices.Max(vals)
	st.Retransmits = Median(retr)
	if len(ca) > 0 {
		st.HasCPU = true
		st.CPUA, st.CPUB, st.Softirq, st.Host = Median(ca), Median(cb), Median(sirq), Median(host)
	}
	return st
}

// Hops is where an echo's round trip went, in microseconds, from the
// kernel's time stamps at the gateways' LAN and transit interfaces (A: the
// client's gateway, B: the server's).
type Hops struct {
	AOutUs   float64 `json:"a_out_us"`  // A: request, LAN link to transit link
	BInUs    float64 `json:"b_in_us"`   // B: request, transit link to LAN link
	ServerUs float64 `json:"server_us"` // B's LAN link to the server and back
	BOutUs   float64 `json:"b_out_us"`  // B: reply, LAN link to transit link
	AInUs    float64 `json:"a_in_us"`   // A: reply, transit link to LAN link
	WireUs   float64 `json:"wire_us"`   // both crossings of the transit link
	ClientUs float64 `json:"client_us"` // the client and its link
	Followed int     `json:"followed"`  // requests followed
}
