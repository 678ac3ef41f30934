package load

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/espd/espd/testbed"
)

// IPerf3Binary is the iperf3 the harness runs with -tool iperf3.
const IPerf3Binary = "iperf3"

// IPerf3Available reports whether iperf3 is installed, and if not, which
// Debian package provides it.
func IPerf3Available() error {
	if _, err := exec.LookPath(IPerf3Binary); err != nil {
		return errors.New("iperf3 not found (Debian package iperf3)")
	}
	return nil
}

// iperf3Report is the part of iperf3's JSON report (-J) the harness reads.
type iperf3Report struct {
	End struct {
		SumSent struct {
			Bytes       int64   `json:"bytes"`
			Seconds     float64 `json:"seconds"`
			Retransmits uint32  `json:"retransmits"`
		} `json:"sum_sent"`
		SumReceived struct {
			Bytes         int64   `json:"bytes"`
			Seconds       float64 `json:"seconds"`
			BitsPerSecond float64 `json:"bits_per_second"`
		} `json:"sum_received"`
	} `json:"end"`
	Start struct {
		TCPMSS        uint32 `json:"tcp_mss"`
		TCPMSSDefault uint32 `json:"tcp_mss_default"`
	} `json:"start"`
	Error string `json:"error"`
}

// parseIPerf3 reads an iperf3 -J report into a TCPResult: the receiver's
// bytes and seconds (omitted seconds excluded, as iperf3 reports them),
// the sender's retransmits and the MSS.
func parseIPerf3(b []byte) (TCPResult, error) {
	var r iperf3Report
	if err := json.Unmarshal(b, &r); err != nil {
		return TCPResult{}, fmt.Errorf("load: iperf3 report: %w", err)
	}
	if r.Error != "" {
		return TCPResult{}, fmt.Errorf("load: iperf3: %s", r.Error)
	}
	rx := r.End.SumReceived
	if rx.Seconds <= 0 {
		return TCPResult{}, errors.New("load: iperf3 report without a receiver summary")
	}
	mss := r.Start.TCPMSS
	if mss == 0 {
		mss = r.Start.TCPMSSDefault
	}
	return TCPResult{
		Bytes:       rx.Bytes,
		Elapsed:     time.Duration(rx.Seconds * float64(time.Second)),
		Retransmits: r.End.SumSent.Retransmits,
		MSS:         mss,
	}, nil
}

// IPerf3TCP measures like TCP with iperf3: a server (iperf3 -s -1) on
// o.To and a client (iperf3 -c -O omit -t duration -M mss -J) on o.From.
// The window hook brackets the client's whole run (warm-up included), as
// iperf3 reports no finer. dir holds the server's log.
func IPerf3TCP(ctx context.Context, o TCPOptions, dir string) (TCPResult, error) {
	if o.From == nil || o.To == nil || !o.Dst.IsValid() || o.Duration <= 0 {
		return TCPResult{}, errors.New("load: IPerf3TCP needs From, To, Dst and Duration > 0")
	}
	port := o.Port
	if port == 0 {
		port = 5201
	}
	logPath := filepath.Join(dir, "iperf3-server.log")
	srv, err := o.To.Start(logPath, IPerf3Binary, "-s", "-1", "-B", o.Dst.String(), "-p", strconv.Itoa(int(port)))
	if err != nil {
		return TCPResult{}, err
	}
	defer srv.Stop(2 * time.Second)
	if err := waitListening(ctx, o.To, netip.AddrPortFrom(o.Dst, port), 5*time.Second); err != nil {
		return TCPResult{}, fmt.Errorf("load: iperf3 server: %w\n%s", err, srv.Log())
	}
	secs := func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) }
	args := []string{IPerf3Binary, "-c", o.Dst.String(), "-p", strconv.Itoa(int(port)),
		"-t", secs(o.Duration), "-O", secs(o.Omit), "-J"}
	if o.MSS > 0 {
		args = append(args, "-M", strconv.Itoa(o.MSS))
	}
	if o.Dst.Is6() {
		args = append(args, "-6")
	}
	rctx, cancel := context.WithTimeout(ctx, o.Omit+o.Duration+30*time.Second)
	defer cancel()
	if o.Window != nil {
		o.Window(true)
	}
	out, err := o.From.Run(rctx, args...)
	if o.Window != nil {
		o.Window(false)
	}
	res, perr := parseIPerf3([]byte(out))
	if perr != nil {
		return res, errors.Join(perr, err)
	}
	return res, nil
}

// waitListening waits until a TCP socket listens on addr in node's
// namespace, reading /proc/net/tcp[6] from a thread inside it (connecting
// would use up iperf3 -1's single test).
func waitListening(ctx context.Context, node *testbed.Node, addr netip.AddrPort, max time.Duration) error {
	deadline := time.Now().Add(max)
	file := "/proc/thread-self/net/tcp"
	if addr.Addr().Is6() {
		file += "6"
	}
	want := fmt.Sprintf(":%04X ", addr.Port())
	for {
		var found bool
		err := node.Do(func() error {
			b, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			for _, line := range strings.Split(string(b), "\n") {
				f := strings.Fields(line)
				// local_address is field 1, st field 3 (0A = LISTEN).
				if len(f) > 3 && strings.HasSuffix(f[1]+" ", want) && f[3] == "0A" {
					found = true
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		if found {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nothing listens on %v after %v", addr, max)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
