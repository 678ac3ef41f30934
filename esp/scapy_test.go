package esp

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/net/ipv6"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/packet"
)

// scapyPython is Debian's interpreter, which has python3-scapy.
const scapyPython = "/usr/bin/python3"

// needScapy skips the test when scapy is missing, except in CI (CI=true),
// which installs it and where a missing scapy is a failure.
func needScapy(t *testing.T) {
	t.Helper()
	err := exec.Command(scapyPython, "-c", "import scapy.layers.ipsec, cryptography").Run()
	if err == nil {
		return
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("scapy is required in CI: %s -c 'import scapy.layers.ipsec': %v", scapyPython, err)
	}
	t.Skipf("scapy not available (%v): install python3-scapy", err)
}

// scapyAlgos maps a suite to scapy's algorithm names. scapy 2.5 lacks
// AES-GMAC, always sends 16-byte GCM tags and leaves the ESN high bits out
// of HMAC ICVs, so those suites are checked against crypto's committed
// vectors instead.
func scapyAlgos(s crypto.Suite) (crypt string, auth any) {
	switch s.Encryption {
	case crypto.EncrAESGCM16:
		crypt = "AES-GCM"
	case crypto.EncrChaCha20Poly1305:
		crypt = "CHACHA20-POLY1305"
	case crypto.EncrAESCBC:
		crypt = "AES-CBC"
	case crypto.EncrNull:
		crypt = "NULL"
	}
	switch s.Integrity {
	case crypto.AuthHMACSHA196:
		auth = "HMAC-SHA1-96"
	case crypto.AuthHMACSHA2256128:
		auth = "SHA2-256-128"
	case crypto.AuthHMACSHA2384192:
		auth = "SHA2-384-192"
	case crypto.AuthHMACSHA2512256:
		auth = "SHA2-512-256"
	}
	return crypt, auth
}

type scapyCase struct {
	Crypt   string `json:"crypt"`
	Auth    any    `json:"auth"`
	CKey    string `json:"ckey"`
	AKey    string `json:"akey"`
	SPI     uint32 `json:"spi"`
	ESN     bool   `json:"esn"`
	ESNHi   uint32 `json:"esn_hi"`
	Src     string `json:"src"`
	Dst     string `json:"dst"`
	SPort   uint16 `json:"sport"`
	DPort   uint16 `json:"dport"`
	Decrypt string `json:"decrypt"`
	Inner   string `json:"inner"`
	Seq     uint32 `json:"seq"`
	// Transport: transport mode (no tunnel header).
	Transport bool `json:"transport"`
}

type scapyResult struct {
	Decrypted string `json:"decrypted"`
	Encrypted string `json:"encrypted"`
	Error     string `json:"error"`
}

// TestScapyInterop checks espd against scapy's independent ESP code in both
// directions: scapy decrypts what espd encapsulated, and espd decapsulates
// what scapy encrypted, for IPv4 and IPv6 inside IPv4 and IPv6, raw and in
// UDP, for AES-GCM, ChaCha20-Poly1305, AES-CBC with every HMAC, and NULL.
func TestScapyInterop(t *testing.T) {
	needScapy(t)
	names := []string{"aes128gcm16", "aes192gcm16", "aes256gcm16-esn", "chacha20poly1305", "chacha20poly1305-esn",
		"aes128-sha1", "aes256-sha256", "aes192-sha384", "aes128-sha512", "null-sha256"}
	type meta struct {
		name  string
		tr    crypto.Transform
		o     Outer
		inner []byte
		seq   uint64 // espd's packet
		sseq  uint64 // scapy's packet
	}
	var cases []scapyCase
	var metas []meta
	for _, name := range names {
		s, err := crypto.ParseSuite(name)
		if err != nil {
			t.Fatal(err)
		}
		ck, ak := testKey(name+"enc", s.EncKeyLen()), testKey(name+"integ", s.IntegKeyLen())
		tr, err := crypto.New(s, ck, ak)
		if err != nil {
			t.Fatal(err)
		}
		crypt, auth := scapyAlgos(s)
		for i, oc := range outers() {
			if oc.o.DstPort != 0 { // scapy recognises NAT-T ESP by port 4500
				oc.o.SrcPort, oc.o.DstPort = 4500, 4500
			}
			for _, v := range []int{4, 6} {
				seq := uint64(100 + i*2 + v)
				if s.ESN {
					seq += 3 << 32
				}
				in := inner(v, 200+i*37+v, 0)
				e := &Encapsulator{SPI: 0xc1000000 | uint32(i), Transform: tr, Outer: oc.o}
				buf, off := place(in, MaxTrailer)
				p, err := e.Encapsulate(buf, off, len(in), seq)
				if err != nil {
					t.Fatal(err)
				}
				cases = append(cases, scapyCase{
					Crypt: crypt, Auth: auth, CKey: hex.EncodeToString(ck), AKey: hex.EncodeToString(ak),
					SPI: e.SPI, ESN: s.ESN, ESNHi: uint32(seq >> 32),
					Src: oc.o.Src.String(), Dst: oc.o.Dst.String(), SPort: oc.o.SrcPort, DPort: oc.o.DstPort,
					Decrypt: hex.EncodeToString(buf[:cap(buf)][frame(buf, p, oc.o, seq):p.End]),
					Inner:   hex.EncodeToString(in), Seq: uint32(seq + 1),
				})
				metas = append(metas, meta{name: fmt.Sprintf("%s/%s/inner%d", name, oc.name, v), tr: tr, o: oc.o, inner: in, seq: seq, sseq: seq + 1})
			}
		}
	}
	for i, r := range runScapy(t, cases) {
		m := metas[i]
		_, espPkt, ok := checkScapy(t, m.name, r, m.inner, m.o)
		if !ok {
			continue
		}
		d := &Decapsulator{Transform: m.tr, Replay: NewReplayWindow(64, m.tr.Suite().ESN), ECN: true}
		if m.tr.Suite().ESN {
			d.Replay.Update(m.sseq - 1)
		}
		got, seq, err := d.Decapsulate(espPkt, 0)
		if err != nil {
			t.Errorf("%s: decapsulating scapy's packet: %v", m.name, err)
			continue
		}
		if seq != m.sseq || !bytes.Equal(got, m.inner) {
			t.Errorf("%s: seq %#x (want %#x), inner equal %v", m.name, seq, m.sseq, bytes.Equal(got, m.inner))
		}
	}
	t.Logf("%d cases, each direction", len(cases))
}

// runScapy runs testdata/scapy_interop.py on cases and returns its
// results, one per case, in order.
func runScapy(t *testing.T, cases []scapyCase) []scapyResult {
	t.Helper()
	req, err := json.Marshal(map[string]any{"cases": cases})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, scapyPython, "testdata/scapy_interop.py")
	cmd.Stdin = bytes.NewReader(req)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("scapy peer: %v\n%s", err, stderr.String())
	}
	var resp struct{ Results []scapyResult }
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatalf("scapy peer output: %v", err)
	}
	if len(resp.Results) != len(cases) {
		t.Fatalf("%d results for %d cases", len(resp.Results), len(cases))
	}
	return resp.Results
}

// checkScapy checks one scapy result: no error, and scapy decrypted
// espd's packet into want. It returns scapy's own outer packet and its ESP
// packet (outerPayload, checked against o), and false if the test cannot
// go on with them.
func checkScapy(t *testing.T, name string, r scapyResult, want []byte, o Outer) (outer, espPkt []byte, ok bool) {
	t.Helper()
	if r.Error != "" {
		t.Errorf("%s: scapy: %s", name, r.Error)
		return nil, nil, false
	}
	dec, _ := hex.DecodeString(r.Decrypted)
	if !bytes.Equal(dec, want) {
		t.Errorf("%s: scapy decrypted a different packet:\n got % x\nwant % x", name, dec, want)
	}
	outer, _ = hex.DecodeString(r.Encrypted)
	espPkt, err := outerPayload(outer, o)
	if err != nil {
		t.Errorf("%s: scapy's outer packet: %v", name, err)
		return nil, nil, false
	}
	return outer, espPkt, true
}

// outerPayload strips the outer IP (and UDP) header of an ESP packet,
// checking that it matches o.
func outerPayload(b []byte, o Outer) ([]byte, error) {
	var proto uint8
	var rest []byte
	if o.Src.Is4() {
		h, err := packet.ParseIPv4Header(b)
		if err != nil {
			return nil, err
		}
		if h.Src != o.Src || h.Dst != o.Dst {
			return nil, fmt.Errorf("addresses %v -> %v", h.Src, h.Dst)
		}
		proto, rest = h.Protocol, b[h.HeaderLen:h.TotalLen]
	} else {
		h, err := ipv6.ParseHeader(b)
		if err != nil {
			return nil, err
		}
		if h.Version != 6 || 40+h.PayloadLen > len(b) {
			return nil, fmt.Errorf("IPv6 header %v in %d bytes", h, len(b))
		}
		src, _ := netip.AddrFromSlice(h.Src)
		dst, _ := netip.AddrFromSlice(h.Dst)
		if src != o.Src || dst != o.Dst {
			return nil, fmt.Errorf("addresses %v -> %v", src, dst)
		}
		proto, rest = uint8(h.NextHeader), b[40:40+h.PayloadLen]
	}
	if o.DstPort != 0 {
		if proto != packet.ProtoUDP {
			return nil, fmt.Errorf("protocol %d, want UDP", proto)
		}
		if len(rest) < packet.UDPHeaderLen {
			return nil, fmt.Errorf("UDP: %d bytes", len(rest))
		}
		port, l := binary.BigEndian.Uint16(rest[2:4]), int(binary.BigEndian.Uint16(rest[4:6]))
		if l < packet.UDPHeaderLen || l > len(rest) {
			return nil, fmt.Errorf("UDP: length %d in %d bytes", l, len(rest))
		}
		p := rest[packet.UDPHeaderLen:l]
		if port != o.DstPort || ClassifyUDP(p) != UDPESP {
			return nil, fmt.Errorf("UDP: port %d, kind %v", port, ClassifyUDP(p))
		}
		return p, nil
	}
	if proto != packet.ProtoESP {
		return nil, fmt.Errorf("protocol %d, want ESP", proto)
	}
	return rest, nil
}
