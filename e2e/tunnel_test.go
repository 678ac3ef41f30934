package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// SPIs of the tunnel: A to B and B to A.
const (
	spiAB uint32 = 0x1001
	spiBA uint32 = 0x2001
)

// Transfer sizes: the full transfers of the suite matrix, and the smaller
// ones used where a test only needs traffic beside something else.
const (
	bigTransfer   = 20 << 20 // 20 MiB, above the 20 MB asked for
	smallTransfer = 2 << 20
)

// keyLens gives the encryption key (salt included) and integrity key
// lengths of the suites the tests use.
var keyLens = map[string][2]int{
	"aes128gcm16":      {20, 0},
	"aes256gcm16":      {36, 0},
	"chacha20poly1305": {36, 0},
	"aes128-sha256":    {16, 32},
	"aes256-sha1":      {32, 20},
}

func randKey(t testing.TB, n int) []byte {
	t.Helper()
	if n == 0 {
		return nil
	}
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// tunnelOpts describe a site-to-site tunnel between gwA and gwB.
type tunnelOpts struct {
	suite string         // default aes128gcm16
	outer testbed.Family // default IPv4
	encap bool           // ESP-in-UDP on port 4500
	// inner lists the families of the LAN traffic the policies protect;
	// default IPv4 and IPv6.
	inner        []testbed.Family
	replayWindow int
	// mismatch gives gwB's inbound state for A->B a key other than the
	// one gwA encrypts with.
	mismatch bool
	// hardBytes, if set, is the hard byte lifetime of gwA's outbound state.
	hardBytes  uint64
	transitMTU int
	// espdArgs are extra espd flags for both gateways, espdArgsB for gwB
	// only.
	espdArgs, espdArgsB []string
}

// tunnel is a running espd on each gateway, keyed with espctl.
type tunnel struct {
	top            *testbed.Topology
	a, b           *espd
	o              tunnelOpts
	aOuter, bOuter netip.Addr
	// What was installed on each side, to install it again.
	aSAs, bSAs           []saSpec
	aPolicies, bPolicies []policySpec
}

// keyIn returns the first of the tunnel's keys, in hex, that s contains, or
// "".
func (tn *tunnel) keyIn(s string) string {
	s = strings.ToLower(s)
	for _, sa := range append(append([]saSpec{}, tn.aSAs...), tn.bSAs...) {
		for _, k := range [][]byte{sa.encKey, sa.integKey} {
			if h := hex.EncodeToString(k); len(k) > 0 && strings.Contains(s, h) {
				return h
			}
		}
	}
	return ""
}

// keyA installs gwA's states and policies on e (a restarted gwA).
func (tn *tunnel) keyA(t *testing.T, e *espd) {
	t.Helper()
	for _, s := range tn.aSAs {
		e.addSA(t, s)
	}
	for _, p := range tn.aPolicies {
		e.addPolicy(t, p)
	}
}

func requireTools(t testing.TB) {
	t.Helper()
	if err := testbed.Available(); err != nil {
		t.Skip(err)
	}
	for _, tool := range []string{"ping", "setpriv"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
}

// newTopology builds a test bed whose namespaces go away with the test.
func newTopology(t *testing.T, transitMTU int) *testbed.Topology {
	t.Helper()
	requireTools(t)
	return testbed.NewT(t, testbed.Options{Prefix: "e2e", TransitMTU: transitMTU})
}

// newTunnel builds the test bed, starts espd on both gateways and keys the
// tunnel through espctl.
func newTunnel(t *testing.T, o tunnelOpts) *tunnel {
	t.Helper()
	if o.suite == "" {
		o.suite = "aes128gcm16"
	}
	if o.outer == 0 {
		o.outer = testbed.IPv4
	}
	if len(o.inner) == 0 {
		o.inner = []testbed.Family{testbed.IPv4, testbed.IPv6}
	}
	kl, ok := keyLens[o.suite]
	if !ok {
		t.Fatalf("no key lengths for suite %s", o.suite)
	}
	tn := &tunnel{o: o, top: newTopology(t, o.transitMTU)}
	// Registered before the daemons start, so it runs after they stopped
	// and their logs are complete: no key may appear in them.
	t.Cleanup(func() {
		for _, e := range []*espd{tn.a, tn.b} {
			if e != nil {
				if k := tn.keyIn(e.proc.Log()); k != "" {
					t.Errorf("espd on %s logged key %s", e.node.Role, k)
				}
			}
		}
	})
	tn.aOuter = testbed.Pick(o.outer, testbed.GwATransitV4.Addr(), testbed.GwATransitV6.Addr())
	tn.bOuter = testbed.Pick(o.outer, testbed.GwBTransitV4.Addr(), testbed.GwBTransitV6.Addr())
	tn.a = startEspd(t, tn.top.GwA, o.espdArgs...)
	tn.b = startEspd(t, tn.top.GwB, append(append([]string(nil), o.espdArgs...), o.espdArgsB...)...)

	abEnc, abInt := randKey(t, kl[0]), randKey(t, kl[1])
	baEnc, baInt := randKey(t, kl[0]), randKey(t, kl[1])
	bInEnc, bInInt := abEnc, abInt
	if o.mismatch {
		bInEnc, bInInt = randKey(t, kl[0]), randKey(t, kl[1])
	}
	sa := func(spi uint32, dir string, src, dst netip.Addr, enc, integ []byte) saSpec {
		return saSpec{spi: spi, dir: dir, src: src, dst: dst, suite: o.suite, encKey: enc, integKey: integ,
			reqid: 1, replayWindow: o.replayWindow, encap: o.encap}
	}
	aOut := sa(spiAB, "out", tn.aOuter, tn.bOuter, abEnc, abInt)
	aOut.hardBytes = o.hardBytes
	tn.aSAs = []saSpec{aOut, sa(spiBA, "in", tn.bOuter, tn.aOuter, baEnc, baInt)}
	tn.bSAs = []saSpec{sa(spiBA, "out", tn.bOuter, tn.aOuter, baEnc, baInt), sa(spiAB, "in", tn.aOuter, tn.bOuter, bInEnc, bInInt)}
	for _, f := range o.inner {
		lanA := testbed.Pick(f, testbed.LANAV4, testbed.LANAV6)
		lanB := testbed.Pick(f, testbed.LANBV4, testbed.LANBV6)
		tn.aPolicies = append(tn.aPolicies,
			policySpec{src: lanA, dst: lanB, dir: "out", action: "protect", reqid: 1},
			policySpec{src: lanB, dst: lanA, dir: "in", action: "protect", reqid: 1})
		tn.bPolicies = append(tn.bPolicies,
			policySpec{src: lanB, dst: lanA, dir: "out", action: "protect", reqid: 1},
			policySpec{src: lanA, dst: lanB, dir: "in", action: "protect", reqid: 1})
	}
	tn.keyA(t, tn.a)
	for _, s := range tn.bSAs {
		tn.b.addSA(t, s)
	}
	for _, p := range tn.bPolicies {
		tn.b.addPolicy(t, p)
	}
	t.Logf("tunnel %s, %s outer, %s, inner %v, espd args %v, gwB also %v", o.suite, o.outer, map[bool]string{false: "raw ESP", true: "ESP-in-UDP"}[o.encap], o.inner, o.espdArgs, o.espdArgsB)
	return tn
}

func clientAddr(f testbed.Family) netip.Addr {
	return testbed.Pick(f, testbed.ClientV4.Addr(), testbed.ClientV6.Addr())
}

func serverAddr(f testbed.Family) netip.Addr {
	return testbed.Pick(f, testbed.ServerV4.Addr(), testbed.ServerV6.Addr())
}

// ping requires every echo request from the client (or the server, if
// reverse) to the other end to be answered.
func ping(t *testing.T, ctx context.Context, top *testbed.Topology, f testbed.Family, reverse bool) {
	t.Helper()
	from, dst := top.Client, serverAddr(f)
	if reverse {
		from, dst = top.Server, clientAddr(f)
	}
	r, err := from.Ping(ctx, dst, testbed.PingOptions{Count: 3})
	if err != nil {
		t.Fatalf("ping %v from %s: %v", dst, from.Role, err)
	}
	if !r.OK() {
		t.Fatalf("ping %v from %s: %d of %d answered:\n%s", dst, from.Role, r.Received, r.Transmitted, r.Output)
	}
}

// transfer runs a TCP transfer of size bytes client->server (up) or
// server->client and requires the hashes to match.
func transfer(t *testing.T, ctx context.Context, top *testbed.Topology, f testbed.Family, up bool, size int64) testbed.TransferResult {
	t.Helper()
	r, err := transferErr(t, ctx, top, f, up, size)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// transferErr is transfer for other goroutines than the test's: it returns
// the error instead of failing the test.
func transferErr(t *testing.T, ctx context.Context, top *testbed.Topology, f testbed.Family, up bool, size int64) (testbed.TransferResult, error) {
	return pacedTransfer(t, ctx, top, f, up, size, 0)
}

// pacedTransfer is transferErr with the sender paced to rate bytes per
// second (0: unpaced).
func pacedTransfer(t *testing.T, ctx context.Context, top *testbed.Topology, f testbed.Family, up bool, size int64, rate uint64) (testbed.TransferResult, error) {
	o := testbed.TransferOptions{From: top.Client, To: top.Server, Dst: serverAddr(f), Bytes: size,
		Timeout: 120 * time.Second, Seed: uint64(size) ^ uint64(f), MaxRate: rate}
	dir := "client->server"
	if !up {
		o.From, o.To, o.Dst, dir = top.Server, top.Client, clientAddr(f), "server->client"
		o.Seed++
	}
	r, err := testbed.Transfer(ctx, o)
	if err != nil {
		return r, fmt.Errorf("%s transfer %s of %d bytes: %w (%v)", f, dir, size, err, r)
	}
	t.Logf("%s %s: %v", f, dir, r)
	return r, nil
}

// writeSecret writes a file readable by root only (it holds keys).
func writeSecret(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// describe names a family combination, e.g. "IPv6-in-IPv4".
func describe(inner, outer testbed.Family) string {
	return fmt.Sprintf("%s-in-%s", inner, outer)
}

// socketDrops returns, for a gateway, the drops the kernel counted on the
// raw ESP sockets (protocol 50) and on the UDP sockets of port 4500
// (/proc/net/raw, raw6, udp, udp6): packets lost because espd did not read
// them fast enough.
func socketDrops(t *testing.T, ctx context.Context, n *testbed.Node) map[string]uint64 {
	t.Helper()
	m := map[string]uint64{}
	for _, f := range []struct{ file, port string }{{"raw", "0032"}, {"raw6", "0032"}, {"udp", "1194"}, {"udp6", "1194"}} {
		out, err := n.Run(ctx, "cat", "/proc/net/"+f.file)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(out, "\n")[1:] {
			fields := strings.Fields(line)
			if len(fields) < 2 || !strings.HasSuffix(fields[1], ":"+f.port) {
				continue
			}
			d, err := strconv.ParseUint(fields[len(fields)-1], 10, 64)
			if err != nil {
				t.Fatalf("/proc/net/%s: %q", f.file, line)
			}
			m[f.file] += d
		}
	}
	return m
}
