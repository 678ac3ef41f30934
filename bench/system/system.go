// Package system holds the data paths the benchmark harness compares, each
// on its own testbed line (client - gwA - gwB - server): plain routing,
// espd keyed through its control socket, the kernel's XFRM, strongSwan's
// userspace ESP (charon with kernel-libipsec), wireguard-go, and espd keyed
// by charon through the espd plugin. The host-to-host systems (HostToHost:
// the two gateways' own traffic in the clear, through espd in transport
// mode, through the kernel's XFRM in transport mode) are measured between
// gwA and gwB instead.
//
// A System is set up once per harness run. Systems whose data path depends
// on the ESP suite (PerSuite) are keyed for one suite at a time with Key
// and Unkey; the others carry their own cipher.
package system

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/testbed"
)

// Env is what the harness gives every system.
type Env struct {
	// Dir is the run's working directory; each system keeps its logs,
	// sockets and configuration files in a subdirectory named after it.
	Dir string
	// Family is the address family of the inner and the outer traffic.
	Family testbed.Family
	// Prefix starts the names of the namespaces.
	Prefix string
	// EspdBin is the espd binary the harness built.
	EspdBin string
	// BaselineBin, if set, is another espd binary (an earlier commit's)
	// that the espd-baseline systems run beside espd in the same run.
	BaselineBin string
	// WireGuardBin is the wireguard-go binary, if any.
	WireGuardBin string
	// Logf receives progress details (verbose mode); may be nil.
	Logf func(format string, args ...any)
	// Profile starts every espd with its pprof server on ProfileAddr, so
	// that the harness can record CPU profiles (Profiler).
	Profile bool
}

// dir returns (creating it) the system's working directory.
func (e *Env) dir(name string) (string, error) {
	d := filepath.Join(e.Dir, name)
	if err := os.MkdirAll(d, 0o700); err != nil {
		return "", fmt.Errorf("system: %w", err)
	}
	return d, nil
}

// Counters are a tunnel's own counts of what it carried, read after a run
// to check that the traffic went through it.
type Counters struct {
	// OutPackets counts packets gwA's outbound state protected, InPackets
	// those gwB's inbound state accepted.
	OutPackets, InPackets uint64
	// InDrops counts what gwB's inbound state dropped.
	InDrops uint64
}

// System is one data path under test.
type System interface {
	// Name is the system's name on the command line ("espd").
	Name() string
	// Label is its name in reports ("strongSwan kernel-libipsec").
	Label() string
	// PerSuite reports whether the system is keyed for each ESP suite;
	// if not, Cipher says what it encrypts with.
	PerSuite() bool
	Cipher() string
	// Available returns nil, or a *SkipError naming what is missing.
	Available(env *Env) error
	// Setup builds the system's testbed line and starts what does not
	// depend on the suite.
	Setup(ctx context.Context, env *Env) error
	// Key configures the tunnel for suite (PerSuite systems; others
	// ignore it). An *UnavailableError means this system cannot carry
	// the suite here.
	Key(ctx context.Context, suite crypto.Suite) error
	// Unkey removes what Key installed.
	Unkey(ctx context.Context) error
	// Topology is the system's line (after Setup).
	Topology() *testbed.Topology
	// Gateways returns the pids of the data-plane processes on gwA and on
	// gwB (none for kernel data paths).
	Gateways() (a, b []int)
	// Counters returns the tunnel's counters, or ok false if it has none
	// the harness reads.
	Counters(ctx context.Context) (c Counters, ok bool, err error)
	// Close stops everything and removes the line.
	Close() error
}

// SkipError says why an optional system cannot run here and what would
// enable it.
type SkipError struct {
	Reason string
	// Enable is the command or package that would enable it.
	Enable string
}

func (e *SkipError) Error() string {
	if e.Enable == "" {
		return e.Reason
	}
	return fmt.Sprintf("%s (enable with: %s)", e.Reason, e.Enable)
}

// UnavailableError says why a system cannot carry a suite here.
type UnavailableError struct{ Reason string }

func (e *UnavailableError) Error() string { return e.Reason }

// IsUnavailable reports whether err is an *UnavailableError.
func IsUnavailable(err error) bool {
	var ue *UnavailableError
	return errors.As(err, &ue)
}

// All returns every system the harness knows, in report order: the
// gateway systems, then the host-to-host ones (HostToHost).
func All() []System {
	return []System{
		&Routing{},
		NewEspd("espd", "espd", "", false),
		NewEspd("espd-noaesni", "espd, no AES-NI/AVX2", NoAESNI, false),
		NewEspdXDP("espd-xdp", "espd, raw ESP, AF_XDP receive", "", "auto"),
		NewEspdXDP("espd-xdp-noaesni", "espd, raw ESP, AF_XDP receive, no AES-NI/AVX2", NoAESNI, "auto"),
		NewEspdXDP("espd-xdp-native", "espd, raw ESP, AF_XDP receive, native XDP", "", "native"),
		NewEspd("espd-udp", "espd, ESP-in-UDP", "", true),
		NewEspd("espd-udp-noaesni", "espd, ESP-in-UDP, no AES-NI/AVX2", NoAESNI, true),
		NewEspdBaseline("espd-baseline", "espd, baseline binary", false),
		NewEspdBaseline("espd-udp-baseline", "espd, ESP-in-UDP, baseline binary", true),
		&XFRM{},
		&XFRM{Pcrypt: true},
		&XFRM{NoAESNI: true},
		&XFRM{Pcrypt: true, NoAESNI: true},
		NewCharon(CharonLibipsec),
		NewLibipsecNoAESNI(),
		NewCharon(CharonEspd),
		NewWireGuard("wireguard-go", "wireguard-go", ""),
		NewWireGuard("wireguard-go-noaesni", "wireguard-go, no AES-NI/AVX2", NoAESNI),
		&HostsPlain{},
		NewEspdTransport("espd-transport", hostLabel("espd"), false),
		NewEspdTransport("espd-transport-udp", hostLabel("espd, ESP-in-UDP"), true),
		&XFRMTransport{},
	}
}

// NoAESNI is the GODEBUG setting that makes a Go program run as on a CPU
// without AES-NI, carry-less multiplication and AVX2: Go's crypto falls
// back to its portable code.
const NoAESNI = "cpu.aes=off,cpu.pclmulqdq=off,cpu.avx2=off"

// Addresses of a line for one family.
type addrs struct {
	gwA, gwB    netip.Addr   // transit (outer)
	lanA, lanB  netip.Prefix // inner networks
	client, srv netip.Addr
	gwALAN      netip.Addr
}

func addrsOf(f testbed.Family) addrs {
	return addrs{
		gwA:    testbed.Pick(f, testbed.GwATransitV4, testbed.GwATransitV6).Addr(),
		gwB:    testbed.Pick(f, testbed.GwBTransitV4, testbed.GwBTransitV6).Addr(),
		lanA:   testbed.Pick(f, testbed.LANAV4, testbed.LANAV6),
		lanB:   testbed.Pick(f, testbed.LANBV4, testbed.LANBV6),
		client: testbed.Pick(f, testbed.ClientV4, testbed.ClientV6).Addr(),
		srv:    testbed.Pick(f, testbed.ServerV4, testbed.ServerV6).Addr(),
		gwALAN: testbed.Pick(f, testbed.GwALANV4, testbed.GwALANV6).Addr(),
	}
}

// TestKey derives n bytes of deterministic keying material from label:
// SHA-256 in counter mode. The harness's keys are test keys, the same in
// every run, so that a capture can be decrypted when a number looks wrong.
func TestKey(label string, n int) []byte {
	out := make([]byte, 0, n+sha256.Size)
	for i := uint32(0); len(out) < n; i++ {
		h := sha256.New()
		h.Write([]byte("espd-bench test key\x00" + label + "\x00"))
		h.Write(binary.BigEndian.AppendUint32(nil, i))
		out = h.Sum(out)
	}
	return out[:n]
}

// SuiteKeys returns the deterministic encryption and integrity keys of the
// state with the given SPI for suite s: every system the harness keys
// itself (espd, kernel XFRM) gets the same ones.
func SuiteKeys(s crypto.Suite, spi uint32) (enc, integ []byte) {
	label := fmt.Sprintf("%v %08x", s, spi)
	return TestKey(label+" enc", s.EncKeyLen()), TestKey(label+" integ", s.IntegKeyLen())
}

// newLine builds a testbed line for a system.
func newLine(env *Env, routeLANs bool) (*testbed.Topology, error) {
	return testbed.New(testbed.Options{Prefix: env.Prefix, RouteLANs: routeLANs, Logf: env.Logf})
}

// lastLines returns the last n lines of s, for error messages.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitFor polls cond every 50 ms until it returns true or an error, or
// until max passes or ctx ends.
func waitFor(ctx context.Context, max time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(max)
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not after %v", what, max)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stopAll stops processes, newest first, and joins their errors.
func stopAll(procs ...*testbed.Process) error {
	var errs []error
	for i := len(procs) - 1; i >= 0; i-- {
		if procs[i] != nil {
			errs = append(errs, procs[i].Stop(5*time.Second))
		}
	}
	return errors.Join(errs...)
}
