package crypto

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"testing"
)

// allSuites lists every suite espd implements, every key size, with and
// without ESN.
// The largest IV (AES-CBC), ICV (HMAC-SHA2-512-256) and plaintext alignment
// any transform may have: esp.MaxHeadroom and esp.MaxTrailer are sized for
// them.
const (
	maxIVSize    = 16
	maxICVSize   = 32
	maxBlockSize = 16
)

func allSuites(t testing.TB) []Suite {
	t.Helper()
	var names []string
	for _, bits := range []string{"128", "192", "256"} {
		names = append(names, "aes"+bits+"gcm16", "aes"+bits+"gcm12", "aes"+bits+"gmac")
		for _, integ := range []string{"sha1", "sha256", "sha384", "sha512"} {
			names = append(names, "aes"+bits+"-"+integ)
		}
	}
	names = append(names, "chacha20poly1305", "null-sha1", "null-sha256", "null-sha384", "null-sha512")
	var out []Suite
	for _, n := range names {
		for _, esn := range []string{"", "-esn"} {
			s, err := ParseSuite(n + esn)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, s)
		}
	}
	return out
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func newRandom(t testing.TB, s Suite) (Transform, []byte, []byte) {
	t.Helper()
	ek, ik := randomBytes(s.EncKeyLen()), randomBytes(s.IntegKeyLen())
	tr, err := New(s, ek, ik)
	if err != nil {
		t.Fatalf("New(%v): %v", s, err)
	}
	return tr, ek, ik
}

// layout builds header | IV room | plaintext of n bytes | ICV room.
func layout(tr Transform, spi uint32, seq uint64, pt []byte) []byte {
	pkt := make([]byte, HeaderLen+tr.IVSize()+len(pt)+tr.ICVSize())
	binary.BigEndian.PutUint32(pkt[0:4], spi)
	binary.BigEndian.PutUint32(pkt[4:8], uint32(seq))
	copy(pkt[HeaderLen+tr.IVSize():], pt)
	return pkt
}

func TestTransformSizes(t *testing.T) {
	for _, s := range allSuites(t) {
		tr, _, _ := newRandom(t, s)
		if tr.Suite() != s {
			t.Errorf("%v: Suite() = %v", s, tr.Suite())
		}
		wantIV, wantBlock := 8, 4
		switch s.Encryption {
		case EncrAESCBC:
			wantIV, wantBlock = 16, 16
		case EncrNull:
			wantIV = 0
		}
		if tr.IVSize() != wantIV || tr.BlockSize() != wantBlock || tr.ICVSize() != s.icvLen() {
			t.Errorf("%v: IV %d block %d ICV %d, want %d %d %d", s,
				tr.IVSize(), tr.BlockSize(), tr.ICVSize(), wantIV, wantBlock, s.icvLen())
		}
		if tr.IVSize() > maxIVSize || tr.ICVSize() > maxICVSize || tr.BlockSize() > maxBlockSize {
			t.Errorf("%v: sizes exceed the Max constants", s)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	seqs := []uint64{0, 1, 0xFFFFFFFF, 1 << 32, 0x1234_5678_9ABC_DEF0, ^uint64(0)}
	for _, s := range allSuites(t) {
		tr, _, _ := newRandom(t, s)
		bs := tr.BlockSize()
		for _, n := range []int{bs, 2 * bs, 64, 512, 1408, 9008} {
			n -= n % bs
			for _, seq := range seqs {
				pt := randomBytes(n)
				pkt := layout(tr, 0xC0FFEE01, seq, pt)
				hdr := append([]byte(nil), pkt[:HeaderLen]...)
				tr.Seal(pkt, seq)
				if !bytes.Equal(pkt[:HeaderLen], hdr) {
					t.Fatalf("%v: Seal changed the header", s)
				}
				body := pkt[HeaderLen+tr.IVSize() : len(pkt)-tr.ICVSize()]
				encrypts := s.Encryption != EncrNull && s.Encryption != EncrNullAuthAESGMAC
				if encrypts == bytes.Equal(body, pt) {
					t.Fatalf("%v: after Seal the body equals the plaintext: %v", s, !encrypts)
				}
				if tr.IVSize() == 8 {
					if iv := binary.BigEndian.Uint64(pkt[HeaderLen:]); iv != seq {
						t.Fatalf("%v: IV %#x, want the sequence number %#x", s, iv, seq)
					}
				}
				got, err := tr.Open(pkt, seq)
				if err != nil {
					t.Fatalf("%v n=%d seq=%#x: Open: %v", s, n, seq, err)
				}
				if !bytes.Equal(got, pt) {
					t.Fatalf("%v n=%d seq=%#x: plaintext differs", s, n, seq)
				}
				if &got[0] != &pkt[HeaderLen+tr.IVSize()] || cap(got) != len(got) {
					t.Fatalf("%v: Open did not return the plaintext in place", s)
				}
			}
		}
	}
}

// TestESNHighBits checks that the high 32 bits are authenticated with ESN
// and ignored without it.
func TestESNHighBits(t *testing.T) {
	for _, s := range allSuites(t) {
		tr, _, _ := newRandom(t, s)
		seq := uint64(7)<<32 | 42
		pkt := layout(tr, 0x100, seq, randomBytes(64))
		tr.Seal(pkt, seq)
		_, err := tr.Open(append([]byte(nil), pkt...), seq+1<<32)
		if s.ESN && !errors.Is(err, ErrAuthentication) {
			t.Errorf("%v: Open with other high bits: %v, want ErrAuthentication", s, err)
		}
		if !s.ESN && err != nil {
			t.Errorf("%v: Open without ESN depends on the high bits: %v", s, err)
		}
	}
}

// TestTamper flips every bit of a sealed packet: each must fail with
// ErrAuthentication, since SPI, sequence number, IV, ciphertext and ICV
// are all covered.
func TestTamper(t *testing.T) {
	for _, s := range allSuites(t) {
		tr, _, _ := newRandom(t, s)
		seq := uint64(3)<<32 | 9
		sealed := layout(tr, 0xABCD, seq, randomBytes(2*tr.BlockSize()+32))
		tr.Seal(sealed, seq)
		pkt := make([]byte, len(sealed))
		for i := range len(sealed) * 8 {
			copy(pkt, sealed)
			pkt[i/8] ^= 1 << (i % 8)
			if _, err := tr.Open(pkt, seq); !errors.Is(err, ErrAuthentication) {
				t.Fatalf("%v: bit %d flipped: %v, want ErrAuthentication", s, i, err)
			}
		}
		copy(pkt, sealed)
		if _, err := tr.Open(pkt, seq); err != nil {
			t.Fatalf("%v: untouched packet: %v", s, err)
		}
		// The wrong key never verifies.
		other, _, _ := newRandom(t, s)
		copy(pkt, sealed)
		if _, err := other.Open(pkt, seq); !errors.Is(err, ErrAuthentication) {
			t.Fatalf("%v: other key: %v, want ErrAuthentication", s, err)
		}
	}
}

// TestMalformed truncates and extends a sealed packet to every length up
// to one block more: lengths that cannot be a packet of the transform give
// ErrMalformed, the others ErrAuthentication, and nothing panics.
func TestMalformed(t *testing.T) {
	for _, s := range allSuites(t) {
		tr, _, _ := newRandom(t, s)
		sealed := layout(tr, 1, 1, randomBytes(3*tr.BlockSize()))
		tr.Seal(sealed, 1)
		long := append(append([]byte(nil), sealed...), randomBytes(tr.BlockSize()+3)...)
		for n := 0; n <= len(long); n++ {
			if n == len(sealed) {
				continue
			}
			pkt := append([]byte(nil), long[:n]...)
			_, err := tr.Open(pkt, 1)
			body := n - HeaderLen - tr.IVSize() - tr.ICVSize()
			want := ErrAuthentication
			if body <= 0 || body%tr.BlockSize() != 0 {
				want = ErrMalformed
			}
			if !errors.Is(err, want) {
				t.Fatalf("%v: %d of %d bytes: %v, want %v", s, n, len(sealed), err, want)
			}
		}
		if _, err := tr.Open(nil, 0); !errors.Is(err, ErrMalformed) {
			t.Fatalf("%v: nil packet: %v", s, err)
		}
	}
}

func TestSealLayoutPanics(t *testing.T) {
	for _, s := range allSuites(t) {
		tr, _, _ := newRandom(t, s)
		for _, n := range []int{0, 3, HeaderLen + tr.IVSize() + tr.ICVSize(), HeaderLen + tr.IVSize() + tr.ICVSize() + tr.BlockSize() + 1} {
			func() {
				defer func() {
					r := recover()
					if r == nil || !strings.Contains(fmt.Sprint(r), "crypto: Seal") {
						t.Errorf("%v: Seal of %d bytes: recovered %v, want a crypto: Seal panic", s, n, r)
					}
				}()
				tr.Seal(make([]byte, n), 1)
			}()
		}
	}
}

// TestCBCIVs checks that AES-CBC IVs differ from packet to packet and
// between SAs with the same keys.
func TestCBCIVs(t *testing.T) {
	s, _ := ParseSuite("aes128-sha256")
	a, ek, ik := newRandom(t, s)
	b, err := New(s, ek, ik)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[[16]byte]bool{}
	for seq := range uint64(1000) {
		for _, tr := range []Transform{a, b} {
			pkt := layout(tr, 1, seq, make([]byte, 16))
			tr.Seal(pkt, seq)
			iv := [16]byte(pkt[HeaderLen : HeaderLen+16])
			if seen[iv] {
				t.Fatalf("IV %x repeated", iv)
			}
			seen[iv] = true
		}
	}
}

func TestNewRefuses(t *testing.T) {
	gcm, _ := ParseSuite("aes128gcm16")
	cbc, _ := ParseSuite("aes256-sha384")
	cases := []struct {
		s       Suite
		ek, ik  int
		mention string
	}{
		{gcm, 16, 0, "20 bytes of encryption key, got 16"},
		{gcm, 20, 4, "0 bytes of integrity key, got 4"},
		{cbc, 32, 32, "48 bytes of integrity key, got 32"},
		{cbc, 36, 48, "32 bytes of encryption key, got 36"},
		{Suite{Encryption: Encr3DES, KeyBits: 192, Integrity: AuthHMACSHA196}, 24, 20, "ENCR_3DES"},
		{Suite{Encryption: EncrAESGCM8, KeyBits: 128}, 20, 0, "ENCR_AES_GCM_8"},
	}
	for _, c := range cases {
		tr, err := New(c.s, make([]byte, c.ek), make([]byte, c.ik))
		if err == nil || !strings.Contains(err.Error(), c.mention) {
			t.Errorf("New(%v, %d, %d) = %v, %v; want an error mentioning %q", c.s, c.ek, c.ik, tr, err, c.mention)
		}
	}
}

// TestNewCopiesKeys checks that wiping the caller's key slices after New
// does not change the transform.
func TestNewCopiesKeys(t *testing.T) {
	for _, s := range allSuites(t) {
		tr, ek, ik := newRandom(t, s)
		ek2, ik2 := append([]byte(nil), ek...), append([]byte(nil), ik...)
		clear(ek)
		clear(ik)
		pkt := layout(tr, 5, 5, randomBytes(4*tr.BlockSize()))
		tr.Seal(pkt, 5)
		fresh, err := New(s, ek2, ik2)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := fresh.Open(pkt, 5); err != nil {
			t.Errorf("%v: the transform did not keep its own key copy: %v", s, err)
		}
	}
}

func TestZero(t *testing.T) {
	for _, s := range allSuites(t) {
		tr, _, _ := newRandom(t, s)
		pt := bytes.Repeat([]byte{0xA5}, 4*tr.BlockSize())
		sealed := layout(tr, 9, 9, pt)
		tr.Seal(sealed, 9)
		tr.Zero()
		switch x := tr.(type) {
		case *aeadTransform:
			if x.salt != [4]byte{} || x.aead != nil {
				t.Errorf("%v: salt or cipher left after Zero", s)
			}
		case *gmacTransform:
			if x.salt != [4]byte{} || x.aead != nil {
				t.Errorf("%v: salt or cipher left after Zero", s)
			}
		case *cbcTransform:
			if x.ivKey != [16]byte{} || x.ivSalt != [8]byte{} || x.auth.key != nil || x.block != nil || x.ivBlock != nil {
				t.Errorf("%v: key material left after Zero", s)
			}
		case *nullTransform:
			if x.auth.key != nil {
				t.Errorf("%v: integrity key left after Zero", s)
			}
		default:
			t.Fatalf("%v: unknown transform %T", s, tr)
		}
		if _, err := tr.Open(sealed, 9); !errors.Is(err, ErrAuthentication) {
			t.Errorf("%v: Open after Zero: %v, want ErrAuthentication", s, err)
		}
		pkt := layout(tr, 9, 9, pt)
		tr.Seal(pkt, 9)
		if bytes.Contains(pkt, pt[:4]) || !bytes.Equal(pkt[HeaderLen:], make([]byte, len(pkt)-HeaderLen)) {
			t.Errorf("%v: Seal after Zero let the plaintext out", s)
		}
	}
}

// TestZeroWipesHMACKey checks that the integrity key bytes themselves are
// overwritten, not only dropped.
func TestZeroWipesHMACKey(t *testing.T) {
	s, _ := ParseSuite("aes128-sha256")
	tr, _, _ := newRandom(t, s)
	key := tr.(*cbcTransform).auth.key
	tr.Zero()
	if !bytes.Equal(key, make([]byte, len(key))) {
		t.Error("integrity key copy not wiped")
	}
}

// TestConcurrent seals and opens on one transform from many goroutines;
// with -race it checks that the pooled hashes, modes and scratch are not
// shared.
func TestConcurrent(t *testing.T) {
	for _, name := range []string{"aes128gcm16-esn", "chacha20poly1305", "aes256gmac-esn", "aes128-sha256-esn", "null-sha1"} {
		s, _ := ParseSuite(name)
		tr, _, _ := newRandom(t, s)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := mrand.New(mrand.NewPCG(uint64(g), 1))
				for i := range 200 {
					seq := uint64(g)<<40 | uint64(i)
					pt := make([]byte, tr.BlockSize()*(1+r.IntN(40)))
					for j := range pt {
						pt[j] = byte(r.Uint32())
					}
					pkt := layout(tr, uint32(g), seq, pt)
					tr.Seal(pkt, seq)
					got, err := tr.Open(pkt, seq)
					if err != nil || !bytes.Equal(got, pt) {
						errs <- fmt.Errorf("%v goroutine %d packet %d: %v", s, g, i, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
}

// TestNoAllocs checks the data path allocates nothing per packet once the
// pools are warm. The race detector makes sync.Pool drop items on purpose,
// so the check runs only without it.
func TestNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector; the benchmarks report allocations")
	}
	for _, s := range allSuites(t) {
		tr, _, _ := newRandom(t, s)
		pt := make([]byte, 1408)
		pkt := layout(tr, 1, 1, pt)
		sealed := append([]byte(nil), pkt...)
		tr.Seal(sealed, 1)
		work := make([]byte, len(sealed))
		seal := testing.AllocsPerRun(200, func() { tr.Seal(pkt, 1) })
		open := testing.AllocsPerRun(200, func() {
			copy(work, sealed)
			if _, err := tr.Open(work, 1); err != nil {
				panic(err)
			}
		})
		if seal != 0 || open != 0 {
			t.Errorf("%v: %.1f allocations per Seal, %.1f per Open", s, seal, open)
		}
	}
}
