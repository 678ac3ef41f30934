package e2e

// Every espctl command line of the tests is built here, so that a change of
// espctl's flags changes one file.

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
)

// saSpec is one state to install with "espctl sa add".
type saSpec struct {
	spi              uint32
	dir              string // "in" or "out"
	src, dst         netip.Addr
	suite            string
	encKey, integKey []byte
	reqid            int
	replayWindow     int // 0: espd's default (sa.DefaultReplayWindow)
	encap            bool
	hardBytes        uint64
	// oseq, replaySeq and replayBitmap set where the state's sequence
	// numbers start (0 and nil: not given).
	oseq, replaySeq uint64
	replayBitmap    []byte
	transport       bool // mode transport (default: tunnel)
}

// args returns the command line of "espctl sa add" for s. espctl takes
// no key on its command line (ps would show it): the keys go to files of
// mode 0600 (writeKeyFile), which the caller removes with removeKeyFiles
// once espctl has read them (addSA does).
func (s saSpec) args() []string {
	a := []string{"sa", "add",
		"--spi", fmt.Sprintf("0x%x", s.spi),
		"--dir", s.dir,
		"--src", s.src.String(),
		"--dst", s.dst.String(),
		"--enc", s.suite,
		"--enc-key-file", writeKeyFile(s.encKey),
	}
	if len(s.integKey) > 0 {
		a = append(a, "--integ-key-file", writeKeyFile(s.integKey))
	}
	if s.reqid != 0 {
		a = append(a, "--reqid", strconv.Itoa(s.reqid))
	}
	if s.replayWindow != 0 {
		a = append(a, "--replay-window", strconv.Itoa(s.replayWindow))
	}
	if s.encap {
		a = append(a, "--encap-sport", "4500", "--encap-dport", "4500")
	}
	if s.hardBytes != 0 {
		a = append(a, "--hard-bytes", strconv.FormatUint(s.hardBytes, 10))
	}
	if s.oseq != 0 {
		a = append(a, "--oseq", strconv.FormatUint(s.oseq, 10))
	}
	if s.replaySeq != 0 {
		a = append(a, "--replay-seq", fmt.Sprintf("0x%x", s.replaySeq))
	}
	if len(s.replayBitmap) != 0 {
		a = append(a, "--replay-bitmap", "0x"+hex.EncodeToString(s.replayBitmap))
	}
	if s.transport {
		a = append(a, "--mode", "transport")
	}
	return a
}

// writeKeyFile writes key in hex to a new file of mode 0600 in the
// temporary directory and returns its path (a path that does not exist if
// it could not be written, so that espctl says why). removeKeyFiles
// removes it.
func writeKeyFile(key []byte) string {
	f, err := os.CreateTemp("", "espd-e2e-*.key") // mode 0600
	if err != nil {
		return "/nonexistent/" + err.Error()
	}
	defer f.Close()
	if _, err := f.WriteString(hex.EncodeToString(key) + "\n"); err != nil {
		os.Remove(f.Name())
		return "/nonexistent/" + err.Error()
	}
	return f.Name()
}

// removeKeyFiles removes the key files a command line names.
func removeKeyFiles(args []string) {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--enc-key-file" || args[i] == "--integ-key-file" {
			os.Remove(args[i+1])
		}
	}
}

// addSA installs s on e.
func (e *espd) addSA(t *testing.T, s saSpec) {
	t.Helper()
	args := s.args()
	defer removeKeyFiles(args)
	e.mustCtl(t, args...)
}

// policySpec is one policy to install with "espctl policy add".
type policySpec struct {
	src, dst netip.Prefix
	dir      string // "out", "in", "fwd"
	action   string // "protect", "bypass", "drop"
	reqid    int
	// transport: the template's mode is transport (default: tunnel).
	transport bool
	// proto, sport and dport narrow the selector ("" or 0: any).
	proto        string
	sport, dport uint16
}

func (p policySpec) args() []string {
	a := []string{"policy", "add", "--src", p.src.String(), "--dst", p.dst.String(), "--dir", p.dir}
	if p.action != "" {
		a = append(a, "--action", p.action)
	}
	if p.reqid != 0 {
		a = append(a, "--reqid", strconv.Itoa(p.reqid))
	}
	if p.transport {
		a = append(a, "--mode", "transport")
	}
	if p.proto != "" {
		a = append(a, "--proto", p.proto)
	}
	if p.sport != 0 {
		a = append(a, "--sport", strconv.Itoa(int(p.sport)))
	}
	if p.dport != 0 {
		a = append(a, "--dport", strconv.Itoa(int(p.dport)))
	}
	return a
}

// addPolicy installs p on e.
func (e *espd) addPolicy(t *testing.T, p policySpec) {
	t.Helper()
	e.mustCtl(t, p.args()...)
}

// saGetArgs names one state for sa get / sa del.
func saGetArgs(verb string, spi uint32, dst netip.Addr) []string {
	return []string{"sa", verb, "--spi", fmt.Sprintf("0x%x", spi), "--dst", dst.String()}
}

// ctlJSON runs an espctl command with --json and decodes its output.
func (e *espd) ctlJSON(t *testing.T, args ...string) any {
	t.Helper()
	out := e.mustCtl(t, append([]string{"--json"}, args...)...)
	v, err := decodeJSON(out)
	if err != nil {
		t.Fatalf("espctl --json %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return v
}

// decodeJSON decodes one JSON document, or a sequence of them (one per
// line), into a value (a slice for a sequence).
func decodeJSON(s string) (any, error) {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var docs []any
	for dec.More() {
		var v any
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		docs = append(docs, v)
	}
	switch len(docs) {
	case 0:
		return nil, fmt.Errorf("no JSON in %q", s)
	case 1:
		return docs[0], nil
	}
	return docs, nil
}

// Where espctl --json puts the counters the tests read (cmd/espctl/json.go):
// "sa get" prints a state with its counters under "stats", drops by reason
// under "stats"."drops"; "stats" prints daemon-wide counters under "global".
var (
	cntPackets    = []string{"stats", "packets"}
	cntReplay     = []string{"stats", "drops", "replay"}
	cntIntegrity  = []string{"stats", "drops", "integrity"}
	cntInvalidSPI = []string{"global", "invalid_spi"}
)

// saCounter returns a counter of the state (spi, dst) from "sa get".
func (e *espd) saCounter(t *testing.T, spi uint32, dst netip.Addr, path ...string) uint64 {
	t.Helper()
	v := e.ctlJSON(t, saGetArgs("get", spi, dst)...)
	n, err := jsonCounter(v, path...)
	if err != nil {
		t.Fatalf("sa get 0x%x on %s: %v", spi, e.node.Role, err)
	}
	return n
}

// globalCounter returns a daemon-wide counter from "stats".
func (e *espd) globalCounter(t *testing.T, path ...string) uint64 {
	t.Helper()
	v := e.ctlJSON(t, "stats")
	n, err := jsonCounter(v, path...)
	if err != nil {
		t.Fatalf("stats on %s: %v", e.node.Role, err)
	}
	return n
}

// spis returns the SPIs of the states "sa list" shows.
func (e *espd) spis(t *testing.T) map[uint32]bool {
	t.Helper()
	v := e.ctlJSON(t, "sa", "list")
	list, ok := v.([]any)
	if !ok {
		t.Fatalf("sa list --json on %s is not a list: %v", e.node.Role, v)
	}
	m := map[uint32]bool{}
	for _, item := range list {
		n, err := jsonCounter(item, "spi")
		if err != nil {
			t.Fatalf("sa list --json on %s: %v", e.node.Role, err)
		}
		m[uint32(n)] = true
	}
	return m
}

// jsonCounter returns the unsigned number at path in v.
func jsonCounter(v any, path ...string) (uint64, error) {
	cur := v
	for _, key := range path {
		obj, ok := cur.(map[string]any)
		if !ok {
			b, _ := json.Marshal(v)
			return 0, fmt.Errorf("no object at %q in %s", key, b)
		}
		if cur, ok = obj[key]; !ok {
			b, _ := json.Marshal(v)
			return 0, fmt.Errorf("no %q (path %v) in %s", key, path, b)
		}
	}
	num, ok := cur.(json.Number)
	if !ok {
		return 0, fmt.Errorf("%v is %T %v, not a number", path, cur, cur)
	}
	return strconv.ParseUint(num.String(), 10, 64)
}
