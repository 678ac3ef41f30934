package xfrmguest_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/testbed"
	"github.com/espd/espd/xfrmguest"
)

// The addresses of the interop lab: espd's namespace holds the tap
// device's end of the link (the outer addresses ending in 1) and the
// inner addresses behind espd (198.18.2.1, 2001:db8:2::1); the guest holds
// eth0 (the outer addresses ending in 2) and the inner addresses behind its
// XFRM (198.18.3.1, 2001:db8:3::1).
var (
	espdOuter4  = netip.MustParseAddr("198.18.0.1")
	guestOuter4 = netip.MustParseAddr("198.18.0.2")
	espdOuter6  = netip.MustParseAddr("2001:db8::1")
	guestOuter6 = netip.MustParseAddr("2001:db8::2")
	espdInner4  = netip.MustParseAddr("198.18.2.1")
	guestInner4 = netip.MustParseAddr("198.18.3.1")
	espdInner6  = netip.MustParseAddr("2001:db8:2::1")
	guestInner6 = netip.MustParseAddr("2001:db8:3::1")
)

// The markers the pings carry: espdMarker is iputils ping's 16-byte -p
// pattern (the guest's echo replies carry it back), guestByte busybox
// ping's one-byte -p pattern, searched for as guestMarker. No frame on the
// link may show either, but those of NULL-encryption states.
const (
	espdMarkerHex = "7e5d0a7c1b3f29e4d6a8c0f2e4b69d1a"
	guestByte     = 0xa5
)

var guestMarker = []byte(strings.Repeat(string([]byte{guestByte}), 24))

// udpencapGuestPath is where the guest finds the udpencap program.
const udpencapGuestPath = "/opt/espd/bin/udpencap"

// lab is one guest and one espd, shared by every case of the matrix:
// cases flush both sides' states and policies and key their own.
type lab struct {
	node *testbed.Node
	g    *xfrmguest.Guest
	dir  string
	sock string
	espd *testbed.Process
	cap  *testbed.Capture
	// spi hands out SPIs, two per case, so that the capture can tell the
	// cases' frames apart.
	spi uint32
	// nullSPIs are the SPIs of NULL-encryption states, whose payload is
	// cleartext by design.
	nullSPIs map[uint32]bool
}

// newLab builds udpencap, boots the guest of the kernel series with it, starts espd in the
// guest's tap namespace with both inner addresses on lo, starts udpencap
// in the guest, gives the guest its inner addresses and routes, and starts
// the capture on tap0.
func newLab(t *testing.T, series string) *lab {
	t.Helper()
	dir := t.TempDir()
	udpencap := filepath.Join(dir, "udpencap")
	buildStatic(t, udpencap, "github.com/espd/espd/xfrmguest/cmd/udpencap")
	node, g := bootT(t, series, map[string]string{udpencapGuestPath: udpencap})
	l := &lab{node: node, g: g, dir: dir, sock: filepath.Join(dir, "espd.sock"), spi: 0x10000, nullSPIs: map[uint32]bool{}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	proc, err := node.Start(filepath.Join(dir, "espd.log"), espdBin, "--tun", "esp0", "--socket", l.sock,
		"--state-dir", filepath.Join(dir, "state"), "--workers", "1", "--log-format", "text",
		"--udp-port", strconv.Itoa(testbed.EncapPort))
	if err != nil {
		t.Fatal(err)
	}
	if err := testbed.WaitEspd(ctx, node, proc, l.sock, "esp0"); err != nil {
		t.Fatalf("%v\n%s", err, proc.Log())
	}
	l.espd = proc
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("espd logged:\n%s", testbed.Tail(proc.Log(), 40))
		}
	})
	node.MustIP(t, "addr", "add", espdInner4.String()+"/32", "dev", "lo")
	node.MustIP(t, "addr", "add", espdInner6.String()+"/128", "dev", "lo", "nodad")

	l.guest(t, ctx,
		udpencapGuestPath+" >/tmp/udpencap.log 2>&1 &",
		"ip addr add "+guestInner4.String()+"/32 dev lo",
		"ip addr add "+guestInner6.String()+"/128 dev lo nodad",
		"ip route add "+espdInner4.String()+"/32 via "+espdOuter4.String()+" src "+guestInner4.String(),
		"ip -6 route add "+espdInner6.String()+"/128 via "+espdOuter6.String()+" src "+guestInner6.String(),
	)
	if !testbed.Poll(30*time.Second, 100*time.Millisecond, func() bool {
		out, _, _ := g.Run(ctx, "cat /tmp/udpencap.log")
		return strings.Contains(out, "udpencap: ready")
	}) {
		out, _, _ := g.Run(ctx, "cat /tmp/udpencap.log")
		t.Fatalf("udpencap did not come up in the guest:\n%s", out)
	}

	c, err := node.StartCapture("tap0", testbed.CaptureOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l.cap = c
	return l
}

// buildStatic builds pkg into out as a static binary (CGO_ENABLED=0), for
// the guest.
func buildStatic(t *testing.T, out, pkg string) {
	t.Helper()
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Env = append(testbed.BuildEnv(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
}

// guest runs each command in the guest and fails the test on an error or a
// non-zero exit status.
func (l *lab) guest(t *testing.T, ctx context.Context, cmds ...string) {
	t.Helper()
	for _, c := range cmds {
		if out, err := l.g.MustRun(ctx, c); err != nil {
			t.Fatalf("guest: %v\n%s", err, out)
		}
	}
}

// espctl runs espctl with args and fails the test on an error.
func (l *lab) espctl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := testbed.Espctl(nil, espctlBin, l.sock, args...)
	if err != nil {
		t.Fatalf("espctl %v: %v\n%s", args, err, out)
	}
	return out
}

// flush removes every state and policy on both sides.
func (l *lab) flush(t *testing.T, ctx context.Context) {
	t.Helper()
	l.espctl(t, "policy", "flush")
	l.espctl(t, "sa", "flush")
	l.guest(t, ctx, "ip xfrm policy flush && ip xfrm state flush")
}

// keyFile writes k in hex to a new file of mode 0600 and returns its path:
// espd's keys go through files, never through a command line.
func (l *lab) keyFile(t *testing.T, k []byte) string {
	t.Helper()
	f, err := os.CreateTemp(l.dir, "*.key")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Chmod(0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(hex.EncodeToString(k) + "\n"); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

// keys are one state's random keys.
type keys struct{ enc, integ []byte }

func newKeys(s crypto.Suite) keys {
	k := keys{enc: make([]byte, s.EncKeyLen()), integ: make([]byte, s.IntegKeyLen())}
	rand.Read(k.enc)
	rand.Read(k.integ)
	return k
}

// kernelAlgo returns the algorithm part of "ip xfrm state add" for s keyed
// with k. The keys are on ip's command line: the guest is a throwaway VM
// and iproute2 reads keys no other way.
func kernelAlgo(s crypto.Suite, k keys) (string, error) {
	hexKey := func(b []byte) string { return "0x" + hex.EncodeToString(b) }
	var auth string
	switch s.Integrity {
	case crypto.AuthNone:
	case crypto.AuthHMACSHA196:
		auth = " auth-trunc 'hmac(sha1)' " + hexKey(k.integ) + " 96"
	case crypto.AuthHMACSHA2256128:
		auth = " auth-trunc 'hmac(sha256)' " + hexKey(k.integ) + " 128"
	case crypto.AuthHMACSHA2384192:
		auth = " auth-trunc 'hmac(sha384)' " + hexKey(k.integ) + " 192"
	case crypto.AuthHMACSHA2512256:
		auth = " auth-trunc 'hmac(sha512)' " + hexKey(k.integ) + " 256"
	default:
		return "", fmt.Errorf("no kernel name for %v", s.Integrity)
	}
	switch s.Encryption {
	case crypto.EncrAESGCM16:
		return "aead 'rfc4106(gcm(aes))' " + hexKey(k.enc) + " 128", nil
	case crypto.EncrAESGCM12:
		return "aead 'rfc4106(gcm(aes))' " + hexKey(k.enc) + " 96", nil
	case crypto.EncrChaCha20Poly1305:
		return "aead 'rfc7539esp(chacha20,poly1305)' " + hexKey(k.enc) + " 128", nil
	case crypto.EncrAESCBC:
		return "enc 'cbc(aes)' " + hexKey(k.enc) + auth, nil
	case crypto.EncrNull:
		return "enc 'ecb(cipher_null)' ''" + auth, nil
	}
	return "", fmt.Errorf("no kernel name for %v", s.Encryption)
}

// pair is the two states and policies of one case: out (espd -> guest,
// SPI out) and in (guest -> espd, SPI in), with their outer and inner
// addresses and options.
type pair struct {
	suite          crypto.Suite
	out, in        uint32
	espdO, guestO  netip.Addr
	espdI, guestI  netip.Addr
	udp            bool
	reqid          int
	kOut, kIn      keys
	guestOseq      uint64   // the guest's outbound state's replay-oseq (ESN: 64 bits); 0: none
	guestReplaySeq uint64   // the guest's inbound state's replay-seq; 0: none
	espdOutExtra   []string // extra espctl flags for espd's outbound state
	// transport: both sides key transport mode between the outer
	// addresses, which are then the inner ones too.
	transport bool
}

// newPair returns a case's pair for suite name, outer and inner families
// (v6) and encapsulation, with fresh SPIs and random keys.
func (l *lab) newPair(t *testing.T, name string, outer6, inner6, udp bool) *pair {
	t.Helper()
	s, err := crypto.ParseSuite(name)
	if err != nil {
		t.Fatal(err)
	}
	p := &pair{suite: s, out: l.spi, in: l.spi + 1, udp: udp, reqid: int(l.spi),
		kOut: newKeys(s), kIn: newKeys(s)}
	l.spi += 2
	p.espdO, p.guestO = testbed.Pick(family(outer6), espdOuter4, espdOuter6), testbed.Pick(family(outer6), guestOuter4, guestOuter6)
	p.espdI, p.guestI = testbed.Pick(family(inner6), espdInner4, espdInner6), testbed.Pick(family(inner6), guestInner4, guestInner6)
	if s.Encryption == crypto.EncrNull {
		l.nullSPIs[p.out], l.nullSPIs[p.in] = true, true
	}
	return p
}

// newTransportPair is newPair for a transport-mode case: the hosts' own
// traffic between the outer addresses of family v6.
func (l *lab) newTransportPair(t *testing.T, name string, v6, udp bool) *pair {
	t.Helper()
	p := l.newPair(t, name, v6, v6, udp)
	p.transport = true
	p.espdI, p.guestI = p.espdO, p.guestO
	return p
}

// mode is the pair's mode in ip-xfrm's words.
func (p *pair) mode() string {
	if p.transport {
		return "transport"
	}
	return "tunnel"
}

func family(v6 bool) testbed.Family {
	if v6 {
		return testbed.IPv6
	}
	return testbed.IPv4
}

// hostPrefix returns a as a one-address prefix.
func hostPrefix(a netip.Addr) string { return netip.PrefixFrom(a, a.BitLen()).String() }

// install flushes both sides and keys the pair on both: espd through
// espctl and key files, the guest through ip xfrm.
func (l *lab) install(t *testing.T, ctx context.Context, p *pair) {
	t.Helper()
	l.flush(t, ctx)
	reqid := strconv.Itoa(p.reqid)
	sa := func(spi uint32, dir string, src, dst netip.Addr, k keys, extra []string) {
		args := []string{"sa", "add", "--spi", fmt.Sprintf("0x%x", spi), "--dir", dir,
			"--src", src.String(), "--dst", dst.String(), "--enc", p.suite.String(), "--reqid", reqid}
		if len(k.enc) > 0 {
			args = append(args, "--enc-key-file", l.keyFile(t, k.enc))
		}
		if len(k.integ) > 0 {
			args = append(args, "--integ-key-file", l.keyFile(t, k.integ))
		}
		if p.udp {
			args = append(args, "--encap-sport", strconv.Itoa(testbed.EncapPort), "--encap-dport", strconv.Itoa(testbed.EncapPort))
		}
		if p.transport {
			args = append(args, "--mode", "transport")
		}
		l.espctl(t, append(args, extra...)...)
	}
	sa(p.out, "out", p.espdO, p.guestO, p.kOut, p.espdOutExtra)
	sa(p.in, "in", p.guestO, p.espdO, p.kIn, nil)
	var mode []string
	if p.transport {
		mode = []string{"--mode", "transport"}
	}
	l.espctl(t, append([]string{"policy", "add", "--src", hostPrefix(p.espdI), "--dst", hostPrefix(p.guestI), "--dir", "out", "--action", "protect", "--reqid", reqid}, mode...)...)
	l.espctl(t, append([]string{"policy", "add", "--src", hostPrefix(p.guestI), "--dst", hostPrefix(p.espdI), "--dir", "in", "--action", "protect", "--reqid", reqid}, mode...)...)

	cmds := []string{
		l.guestState(t, p, p.out, p.espdO, p.guestO, p.kOut, 0, p.guestReplaySeq),
		l.guestState(t, p, p.in, p.guestO, p.espdO, p.kIn, p.guestOseq, 0),
		fmt.Sprintf("ip xfrm policy add src %s dst %s dir out priority 100 tmpl src %s dst %s proto esp reqid %s mode %s",
			hostPrefix(p.guestI), hostPrefix(p.espdI), p.guestO, p.espdO, reqid, p.mode()),
		fmt.Sprintf("ip xfrm policy add src %s dst %s dir in priority 100 tmpl src %s dst %s proto esp reqid %s mode %s",
			hostPrefix(p.espdI), hostPrefix(p.guestI), p.espdO, p.guestO, reqid, p.mode()),
	}
	if p.transport && p.guestO.Is6() {
		// A transport policy between two IPv6 hosts on one link covers
		// their neighbour discovery: the kernel would send its
		// solicitations and advertisements to espd's address as ESP,
		// which neighbour discovery cannot use. Bypasses for them, as
		// an administrator of a kernel-XFRM host gives them (espd's
		// side sends them on the link directly, never into the TUN).
		for _, typ := range []string{"135", "136"} {
			for _, dir := range []string{"out", "in"} {
				cmds = append(cmds, fmt.Sprintf("ip xfrm policy add src ::/0 dst ::/0 proto 58 type %s dir %s priority 10 action allow", typ, dir))
			}
		}
	}
	l.guest(t, ctx, strings.Join(cmds, " && "))
}

// guestState returns the ip xfrm state add command of one of the guest's
// states. Every state gets a replay window of 32 (the kernel needs one for
// ESN, and without one it checks no replays); oseq and replaySeq set the
// replay state (high halves too with ESN).
func (l *lab) guestState(t *testing.T, p *pair, spi uint32, src, dst netip.Addr, k keys, oseq, replaySeq uint64) string {
	t.Helper()
	algo, err := kernelAlgo(p.suite, k)
	if err != nil {
		t.Fatal(err)
	}
	// The selector names the inner flow: without one the kernel gives the
	// state one of the outer family, which refuses inner packets of the
	// other (XfrmInStateMismatch).
	innerSrc, innerDst := p.guestI, p.espdI
	if spi == p.out {
		innerSrc, innerDst = p.espdI, p.guestI
	}
	cmd := fmt.Sprintf("ip xfrm state add src %s dst %s proto esp spi 0x%x reqid %d mode %s %s replay-window 32 sel src %s dst %s",
		src, dst, spi, p.reqid, p.mode(), algo, hostPrefix(innerSrc), hostPrefix(innerDst))
	if p.suite.ESN {
		cmd += " flag esn"
	}
	if oseq != 0 {
		cmd += fmt.Sprintf(" replay-oseq 0x%x", uint32(oseq))
		if p.suite.ESN {
			cmd += fmt.Sprintf(" replay-oseq-hi 0x%x", uint32(oseq>>32))
		}
	}
	if replaySeq != 0 {
		cmd += fmt.Sprintf(" replay-seq 0x%x", uint32(replaySeq))
		if p.suite.ESN {
			cmd += fmt.Sprintf(" replay-seq-hi 0x%x", uint32(replaySeq>>32))
		}
	}
	if p.udp {
		oa := "0.0.0.0"
		if src.Is6() {
			oa = "::"
		}
		cmd += fmt.Sprintf(" encap espinudp %d %d %s", testbed.EncapPort, testbed.EncapPort, oa)
	}
	return cmd
}

var pingSummary = regexp.MustCompile(`(\d+) packets transmitted, (\d+) (?:packets )?received`)

// pingFromEspd pings the guest's inner address from espd's, n echo
// requests carrying espdMarker (extra: more iputils ping options), and
// fails the test unless all are answered.
func (l *lab) pingFromEspd(t *testing.T, ctx context.Context, p *pair, n int, extra ...string) {
	t.Helper()
	fam := "-4"
	if p.guestI.Is6() {
		fam = "-6"
	}
	// Not -A: after the last request iputils ping waits only two round
	// trips for its reply once it had one, too short under emulation; 200
	// ms apart, the last reply has that long.
	args := append([]string{"ping", fam, "-n", "-i", "0.2", "-c", strconv.Itoa(n), "-W", "10",
		"-p", espdMarkerHex, "-I", p.espdI.String()}, extra...)
	out, _ := l.node.Run(ctx, append(args, p.guestI.String())...)
	if m := pingSummary.FindStringSubmatch(out); m == nil || m[1] != strconv.Itoa(n) || m[2] != m[1] {
		g, _, _ := l.g.Run(ctx, "ip -s xfrm state; cat /proc/net/xfrm_stat")
		t.Fatalf("espd -> guest: not all of %d pings answered:\n%s\nguest:\n%s\nespd:\n%s", n, out, g, l.espctl(t, "stats"))
	}
}

// pingFromGuest pings espd's inner address from the guest's, n echo
// requests carrying guestByte (extra: more busybox ping options), and
// fails the test unless all are answered.
func (l *lab) pingFromGuest(t *testing.T, ctx context.Context, p *pair, n int, extra string) {
	t.Helper()
	fam := "-4"
	if p.espdI.Is6() {
		fam = "-6"
	}
	// -A: busybox ping sends the next request as soon as the reply is in.
	out, _, err := l.g.Run(ctx, fmt.Sprintf("ping %s -A -c %d %s -W 10 -p %02x -I %s %s", fam, n, extra, guestByte, p.guestI, p.espdI))
	if m := pingSummary.FindStringSubmatch(out); err != nil || m == nil || m[1] != strconv.Itoa(n) || m[2] != m[1] {
		g, _, _ := l.g.Run(ctx, "ip -s xfrm state; cat /proc/net/xfrm_stat")
		t.Fatalf("guest -> espd: not all of %d pings answered (%v):\n%s\nguest:\n%s\nespd:\n%s", n, err, out, g, l.espctl(t, "stats"))
	}
}

// saJSON is what the tests read of espctl's JSON view of a state.
type saJSON struct {
	SPI   uint32 `json:"spi"`
	Stats struct {
		Packets   uint64            `json:"packets"`
		SeqOut    uint64            `json:"seq_out"`
		ReplayTop uint64            `json:"replay_top"`
		Drops     map[string]uint64 `json:"drops"`
	} `json:"stats"`
}

// espdSA returns espd's view of its state spi towards dst.
func (l *lab) espdSA(t *testing.T, spi uint32, dst netip.Addr) saJSON {
	t.Helper()
	var v saJSON
	out := l.espctl(t, "--json", "sa", "get", "--spi", fmt.Sprintf("0x%x", spi), "--dst", dst.String())
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("espctl sa get --json: %v\n%s", err, out)
	}
	return v
}

// guestShowState returns "ip -s xfrm state get" of the guest's state spi
// from src to dst.
func (l *lab) guestShowState(t *testing.T, ctx context.Context, spi uint32, src, dst netip.Addr) string {
	t.Helper()
	out, err := l.g.MustRun(ctx, fmt.Sprintf("ip -s xfrm state get src %s dst %s proto esp spi 0x%x", src, dst, spi))
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var statRE = regexp.MustCompile(`(?m)^(Xfrm\w+)\s+(\d+)$`)

var packetsRE = regexp.MustCompile(`(\d+)\(bytes\), (\d+)\(packets\)`)

// packets returns the packet count of "ip -s xfrm state" output's
// "lifetime current" line (-1 if there is none).
func packets(s string) int {
	m := packetsRE.FindAllStringSubmatch(s, -1)
	if len(m) == 0 {
		return -1
	}
	n, _ := strconv.Atoi(m[len(m)-1][2])
	return n
}

// xfrmStat returns the guest's /proc/net/xfrm_stat.
func (l *lab) xfrmStat(t *testing.T, ctx context.Context) map[string]uint64 {
	t.Helper()
	out, err := l.g.MustRun(ctx, "cat /proc/net/xfrm_stat")
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]uint64{}
	for _, f := range statRE.FindAllStringSubmatch(out, -1) {
		m[f[1]], _ = strconv.ParseUint(f[2], 10, 64)
	}
	if len(m) == 0 {
		t.Fatalf("no counters in /proc/net/xfrm_stat:\n%s", out)
	}
	return m
}
