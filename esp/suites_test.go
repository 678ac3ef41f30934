package esp

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/espd/espd/crypto"
)

// suiteNames are the algorithm combinations espd implements, in
// strongSwan syntax; each is tested with and without ESN.
var suiteNames = []string{
	"aes128gcm16", "aes192gcm16", "aes256gcm16",
	"aes128gcm12", "aes192gcm12", "aes256gcm12",
	"chacha20poly1305",
	"aes128-sha1", "aes128-sha256", "aes128-sha384", "aes128-sha512",
	"aes192-sha1", "aes192-sha256", "aes192-sha384", "aes192-sha512",
	"aes256-sha1", "aes256-sha256", "aes256-sha384", "aes256-sha512",
	"aes128gmac", "aes192gmac", "aes256gmac",
	"null-sha256",
}

// testKey returns n deterministic key bytes for label.
func testKey(label string, n int) []byte {
	k := make([]byte, n)
	for i := range k {
		k[i] = byte(len(label)*37 + i*11 + int(label[i%len(label)]))
	}
	return k
}

// newSuite returns a transform for the strongSwan-style suite name.
func newSuite(tb testing.TB, name string) crypto.Transform {
	tb.Helper()
	s, err := crypto.ParseSuite(name)
	if err != nil {
		tb.Fatalf("ParseSuite(%q): %v", name, err)
	}
	tr, err := crypto.New(s, testKey(name+"enc", s.EncKeyLen()), testKey(name+"integ", s.IntegKeyLen()))
	if err != nil {
		tb.Fatalf("crypto.New(%v): %v", s, err)
	}
	return tr
}

// allSuites returns every suite name with and without ESN.
func allSuites() []string {
	var out []string
	for _, n := range suiteNames {
		out = append(out, n, n+"-esn")
	}
	return out
}

func TestRoundTripSuites(t *testing.T) {
	for _, name := range allSuites() {
		t.Run(name, func(t *testing.T) {
			tr := newSuite(t, name)
			esn := tr.Suite().ESN
			for _, oc := range outers() {
				for _, v := range []int{4, 6} {
					d := &Decapsulator{Transform: tr, Replay: NewReplayWindow(128, esn), ECN: true}
					seq := uint64(1)
					if esn {
						// Start just below 2^32 so the run crosses it.
						seq = 1<<32 - 3
						d.Replay.Update(seq - 1)
					}
					for _, n := range []int{48, 49, 50, 51, 64, 333, 512, 1400} {
						o := oc.o
						o.ECN, o.CopyDSCP = true, true
						e := &Encapsulator{SPI: 0xfeed0001, Transform: tr, Outer: o}
						in := inner(v, n, 0xb8|2)
						buf, off := place(in, MaxTrailer)
						p, err := e.Encapsulate(buf, off, n, seq)
						if err != nil {
							t.Fatalf("%s inner%d %d: %v", oc.name, v, n, err)
						}
						if wireLen(p, e.Outer) != n+e.Overhead(n) {
							t.Fatalf("%s: length %d, Overhead says %d", oc.name, wireLen(p, e.Outer), n+e.Overhead(n))
						}
						tos, _, err := checkOuter(buf, p, o, e.SPI, seq)
						if err != nil {
							t.Fatalf("%s inner%d %d: %v", oc.name, v, n, err)
						}
						if bytes.Contains(buf[p.ESP:p.End], in[28:]) && tr.Suite().Encryption != crypto.EncrNull &&
							tr.Suite().Encryption != crypto.EncrNullAuthAESGMAC {
							t.Fatalf("%s: plaintext visible in the ciphertext", oc.name)
						}
						got, gotSeq, err := d.Decapsulate(buf[p.ESP:p.End], tos)
						if err != nil {
							t.Fatalf("%s inner%d %d seq %#x: decapsulate: %v", oc.name, v, n, seq, err)
						}
						if gotSeq != seq || !bytes.Equal(got, in) {
							t.Fatalf("%s inner%d %d: seq %#x/%#x, inner equal %v", oc.name, v, n, gotSeq, seq, bytes.Equal(got, in))
						}
						seq++
					}
				}
			}
		})
	}
}

func TestTamperSuites(t *testing.T) {
	for _, name := range allSuites() {
		t.Run(name, func(t *testing.T) {
			tr := newSuite(t, name)
			esn := tr.Suite().ESN
			pkt := sealedPacket(t, tr, outers()[1].o, 4, 40+8, 77)
			r := tamperAll(t, tr, pkt, esn)
			if r[crypto.ErrAuthentication] == 0 {
				t.Fatalf("no authentication failures: %v", r)
			}
			for err := range r {
				if err != crypto.ErrAuthentication && err != ErrReplay && err != ErrMalformed {
					t.Errorf("unexpected reason %v", err)
				}
			}
			// Truncations and extensions.
			for n := range len(pkt) + 20 {
				b := make([]byte, n)
				copy(b, pkt)
				d := &Decapsulator{Transform: tr, Replay: NewReplayWindow(64, esn)}
				if _, _, err := d.Decapsulate(b, 0); (err == nil) != (n == len(pkt)) {
					t.Fatalf("length %d of %d: %v", n, len(pkt), err)
				}
			}
			// Decapsulating with the wrong key fails authentication.
			other := newSuite(t, suiteNames[(indexOf(name)+1)%len(suiteNames)])
			if other.IVSize() == tr.IVSize() && other.ICVSize() == tr.ICVSize() && other.BlockSize() == tr.BlockSize() {
				d := &Decapsulator{Transform: other, Replay: NewReplayWindow(64, esn)}
				if _, _, err := d.Decapsulate(append([]byte(nil), pkt...), 0); err == nil {
					t.Fatal("another suite's key opened the packet")
				}
			}
		})
	}
}

func indexOf(name string) int {
	for i, n := range suiteNames {
		if n == name || n+"-esn" == name {
			return i
		}
	}
	return 0
}

func TestDummyAndTFCSuites(t *testing.T) {
	for _, name := range []string{"aes128gcm16-esn", "chacha20poly1305", "aes256-sha512", "aes128gmac", "null-sha256"} {
		tr := newSuite(t, name)
		e := &Encapsulator{SPI: 9, Transform: tr, Outer: outers()[3].o, TFCPadTo: 1000}
		d := &Decapsulator{Transform: tr, Replay: NewReplayWindow(64, tr.Suite().ESN)}
		in := innerV4(60, 0, true)
		buf, off := place(in, 1100)
		p, err := e.Encapsulate(buf, off, 60, 1)
		if err != nil {
			t.Fatal(err)
		}
		if wireLen(p, e.Outer) != 60+e.Overhead(60) || p.End-p.ESP < 1000 {
			t.Fatalf("%s: TFC packet %d bytes", name, wireLen(p, e.Outer))
		}
		got, _, err := d.Decapsulate(buf[p.ESP:p.End], 0)
		if err != nil || !bytes.Equal(got, in) {
			t.Fatalf("%s: TFC round trip: %v", name, err)
		}
		dbuf := make([]byte, MaxHeadroom+500+MaxTrailer)
		p, err = e.EncapsulateDummy(dbuf[:MaxHeadroom], MaxHeadroom, 500, 2)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := d.Decapsulate(dbuf[p.ESP:p.End], 0); err != ErrDummy {
			t.Fatalf("%s: dummy: %v", name, err)
		}
	}
}

func TestNoAllocsSuites(t *testing.T) {
	if raceEnabled {
		// The race detector makes sync.Pool (which the CBC, HMAC and GMAC
		// transforms use for scratch state) drop items on purpose.
		t.Skip("sync.Pool drops items at random under the race detector; run without -race")
	}
	for _, name := range allSuites() {
		tr := newSuite(t, name)
		e := &Encapsulator{SPI: 1, Transform: tr, Outer: outers()[3].o}
		d := &Decapsulator{Transform: tr, Replay: NewReplayWindow(1024, tr.Suite().ESN), ECN: true}
		in := innerV4(1400, 2, false)
		buf, off := place(in, MaxTrailer)
		seq := uint64(0)
		allocs := testing.AllocsPerRun(50, func() {
			seq++
			copy(buf[off:], in)
			p, err := e.Encapsulate(buf, off, len(in), seq)
			if err != nil {
				panic(err)
			}
			if _, _, err := d.Decapsulate(buf[p.ESP:p.End], 2); err != nil {
				panic(fmt.Sprint(name, err))
			}
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocs per round trip", name, allocs)
		}
	}
}
