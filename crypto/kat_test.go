package crypto

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// espVector is a complete ESP packet with its keys, as the JSON files
// under testdata/ hold them (hex strings).
type espVector struct {
	Name      string `json:"name"`
	Source    string `json:"source"`
	Suite     string `json:"suite"`
	EncKey    string `json:"enc_key"`
	IntegKey  string `json:"integ_key"`
	Seq       string `json:"seq"` // 64-bit, hex
	IV        string `json:"iv"`
	Plaintext string `json:"plaintext"` // payload, padding, Pad Length, Next Header
	Packet    string `json:"packet"`    // SPI through ICV
}

func loadJSON(t testing.TB, name string, v any) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

func (v espVector) seq(t testing.TB) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(v.Seq, 16, 64)
	if err != nil {
		t.Fatalf("%s: seq %q: %v", v.Name, v.Seq, err)
	}
	return n
}

func (v espVector) transform(t testing.TB) Transform {
	t.Helper()
	s, err := ParseSuite(v.Suite)
	if err != nil {
		t.Fatalf("%s: %v", v.Name, err)
	}
	tr, err := New(s, unhex(t, v.EncKey), unhex(t, v.IntegKey))
	if err != nil {
		t.Fatalf("%s: %v", v.Name, err)
	}
	return tr
}

// checkOpen opens a copy of the vector's packet and compares the
// plaintext byte for byte.
func checkOpen(t *testing.T, v espVector, tr Transform) {
	t.Helper()
	pkt := unhex(t, v.Packet)
	got, err := tr.Open(pkt, v.seq(t))
	if err != nil {
		t.Errorf("%s: Open: %v", v.Name, err)
		return
	}
	if want := unhex(t, v.Plaintext); !bytes.Equal(got, want) {
		t.Errorf("%s: Open plaintext\n got %x\nwant %x", v.Name, got, want)
	}
}

// sealedLike lays out the vector's header and plaintext with IV and ICV
// room, as package esp would hand them to Seal.
func sealedLike(t testing.TB, v espVector, tr Transform) []byte {
	want := unhex(t, v.Packet)
	pt := unhex(t, v.Plaintext)
	pkt := make([]byte, HeaderLen+tr.IVSize()+len(pt)+tr.ICVSize())
	copy(pkt, want[:HeaderLen])
	copy(pkt[HeaderLen+tr.IVSize():], pt)
	return pkt
}

// TestDraftMcGrewGCM replays the AES-GCM ESP packets of
// draft-mcgrew-gcm-test-01 section 4, including the ESN (12-byte AAD)
// cases: Open must recover the plaintext and Seal, given the draft's IV,
// must produce the packet byte for byte.
func TestDraftMcGrewGCM(t *testing.T) {
	var vs []espVector
	loadJSON(t, "gcm_esp.json", &vs)
	if len(vs) < 10 {
		t.Fatalf("only %d vectors", len(vs))
	}
	esn := 0
	for _, v := range vs {
		tr := v.transform(t)
		if tr.Suite().ESN {
			esn++
		}
		checkOpen(t, v, tr)
		want := unhex(t, v.Packet)
		pkt := sealedLike(t, v, tr)
		iv := uint64(0)
		for _, b := range want[HeaderLen : HeaderLen+8] {
			iv = iv<<8 | uint64(b)
		}
		tr.(*aeadTransform).sealIV(pkt, v.seq(t), iv)
		if !bytes.Equal(pkt, want) {
			t.Errorf("%s: Seal\n got %x\nwant %x", v.Name, pkt, want)
		}
	}
	if esn == 0 {
		t.Error("no ESN vector")
	}
}

// TestRFC7634ESPExample replays the ESP example of RFC 7634 (Appendix A;
// Appendix B is the IKEv2 example). Its IV is not the sequence number, so
// Seal goes through the IV seam.
func TestRFC7634ESPExample(t *testing.T) {
	var vs []espVector
	loadJSON(t, "rfc7634_esp.json", &vs)
	for _, v := range vs {
		tr := v.transform(t)
		checkOpen(t, v, tr)
		pkt := sealedLike(t, v, tr)
		tr.(*aeadTransform).sealIV(pkt, v.seq(t), 0x1011121314151617)
		if want := unhex(t, v.Packet); !bytes.Equal(pkt, want) {
			t.Errorf("%s: Seal\n got %x\nwant %x", v.Name, pkt, want)
		}
	}
}

// TestRFC3602Cases replays the AES-CBC ESP packets of RFC 3602 section 4
// (cases 5 to 8). They carry no ICV, so the transform is keyed with an
// arbitrary HMAC key: Seal with the RFC's IV must produce the RFC's bytes
// before the ICV, and Open of the RFC's bytes with our ICV appended must
// return the RFC's plaintext.
func TestRFC3602Cases(t *testing.T) {
	var vs []espVector
	loadJSON(t, "rfc3602_esp.json", &vs)
	if len(vs) != 4 {
		t.Fatalf("%d vectors, want 4", len(vs))
	}
	for _, v := range vs {
		v.Suite = "aes128-sha256"
		v.IntegKey = hex.EncodeToString(bytes.Repeat([]byte{0x5a}, 32))
		tr := v.transform(t)
		want := unhex(t, v.Packet)
		pkt := sealedLike(t, v, tr)
		tr.(*cbcTransform).sealIV(pkt, v.seq(t), unhex(t, v.IV))
		icvAt := len(pkt) - tr.ICVSize()
		if !bytes.Equal(pkt[:icvAt], want) {
			t.Errorf("%s: Seal\n got %x\nwant %x", v.Name, pkt[:icvAt], want)
			continue
		}
		rfc := append(append([]byte(nil), want...), pkt[icvAt:]...)
		v.Packet = hex.EncodeToString(rfc)
		checkOpen(t, v, tr)
	}
}

// hmacVector is a known HMAC output, truncated as ESP sends it.
type hmacVector struct {
	Name      string `json:"name"`
	Integrity string `json:"integrity"`
	Key       string `json:"key"`
	Data      string `json:"data"`
	ICV       string `json:"icv"`
}

// TestHMACVectors checks the truncated-HMAC plumbing against RFC 2202
// (HMAC-SHA-1, truncated to 96 bits per RFC 2404) and the RFC 4868
// authenticator test cases: sign must write the ICV and verify must
// accept it and refuse any other.
func TestHMACVectors(t *testing.T) {
	var vs []hmacVector
	loadJSON(t, "hmac.json", &vs)
	ids := map[string]IntegrityID{"sha1": AuthHMACSHA196, "sha256": AuthHMACSHA2256128,
		"sha384": AuthHMACSHA2384192, "sha512": AuthHMACSHA2512256}
	seen := map[string]int{}
	for _, v := range vs {
		a := newHMACAuth(ids[v.Integrity], unhex(t, v.Key), false)
		want := unhex(t, v.ICV)
		if len(want) != a.icvSize {
			t.Fatalf("%s: ICV of %d bytes, transform makes %d", v.Name, len(want), a.icvSize)
		}
		data := unhex(t, v.Data)
		buf := append(append([]byte(nil), data...), make([]byte, a.icvSize)...)
		for range 2 { // a second round uses a pooled, Reset hash
			a.sign(buf, 0)
			if got := buf[len(data):]; !bytes.Equal(got, want) {
				t.Errorf("%s: ICV %x, want %x", v.Name, got, want)
			}
			if !a.verify(buf, 0) {
				t.Errorf("%s: verify refused its own ICV", v.Name)
			}
		}
		buf[len(buf)-1] ^= 1
		if a.verify(buf, 0) {
			t.Errorf("%s: verify accepted a wrong ICV", v.Name)
		}
		seen[v.Integrity]++
	}
	for alg := range ids {
		if seen[alg] == 0 {
			t.Errorf("no vector for %s", alg)
		}
	}
}
