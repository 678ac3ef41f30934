package chachapoly

import (
	"bytes"
	"crypto/cipher"
	"math/rand/v2"
	"testing"

	"golang.org/x/crypto/chacha20poly1305"
)

// diffLengths are the plaintext lengths compared with x/crypto: every
// length up to 2048 and some that cross many 256-byte chunks.
func diffLengths() []int {
	var ns []int
	for n := 0; n <= 2048; n++ {
		ns = append(ns, n)
	}
	return append(ns, 4096+15, 8192, 65536+7, 1<<20+193)
}

// pair returns this package's AEAD and x/crypto's for one random key.
func pair(t testing.TB, rng *rand.ChaCha8) (mine, ref cipher.AEAD) {
	t.Helper()
	key := make([]byte, KeySize)
	rng.Read(key)
	mine, err := New(key)
	if err != nil {
		t.Fatal(err)
	}
	ref, err = chacha20poly1305.New(key)
	if err != nil {
		t.Fatal(err)
	}
	return mine, ref
}

// TestDifferential seals and opens every length with random keys, nonces
// and AAD, in place and not, and compares each result with x/crypto's.
func TestDifferential(t *testing.T) {
	need(t)
	rng := rand.NewChaCha8([32]byte{'e', 's', 'p', 'd'})
	r := rand.New(rng)
	for _, n := range diffLengths() {
		mine, ref := pair(t, rng)
		nonce := make([]byte, NonceSize)
		rng.Read(nonce)
		aad := make([]byte, []int{0, 8, 12, 16, 17, 40, 64, 65, 100}[r.IntN(9)])
		rng.Read(aad)
		pt := make([]byte, n)
		rng.Read(pt)
		want := ref.Seal(nil, nonce, pt, aad)

		prefix := []byte{1, 2, 3}
		got := mine.Seal(bytes.Clone(prefix), nonce, pt, aad)
		if !bytes.Equal(got[:3], prefix) || !bytes.Equal(got[3:], want) {
			t.Fatalf("n=%d: Seal differs from x/crypto", n)
		}
		buf := make([]byte, n, n+Overhead)
		copy(buf, pt)
		if got := mine.Seal(buf[:0], nonce, buf, aad); !bytes.Equal(got, want) || &got[0] != &buf[:1][0] {
			t.Fatalf("n=%d: Seal in place differs from x/crypto", n)
		}

		opened, err := mine.Open(bytes.Clone(prefix), nonce, want, aad)
		if err != nil || !bytes.Equal(opened[:3], prefix) || !bytes.Equal(opened[3:], pt) {
			t.Fatalf("n=%d: Open: %v", n, err)
		}
		inPlace := bytes.Clone(want)
		if opened, err := mine.Open(inPlace[:0], nonce, inPlace, aad); err != nil || !bytes.Equal(opened, pt) {
			t.Fatalf("n=%d: Open in place: %v", n, err)
		}
		checkRefused(t, mine, n, nonce, want, aad, r)
	}
}

// checkRefused changes one bit of the ciphertext, the tag, the AAD and
// the nonce in turn and checks that Open refuses each and hands back no
// plaintext.
func checkRefused(t *testing.T, a cipher.AEAD, n int, nonce, sealed, aad []byte, r *rand.Rand) {
	t.Helper()
	flip := func(b []byte) []byte {
		c := bytes.Clone(b)
		c[r.IntN(len(c))] ^= 1 << r.IntN(8)
		return c
	}
	cases := []struct {
		what              string
		nonce, sealed, ad []byte
	}{
		{"tag", nonce, append(bytes.Clone(sealed[:n]), flip(sealed[n:])...), aad},
		{"nonce", flip(nonce), sealed, aad},
	}
	if n > 0 {
		cases = append(cases, struct {
			what              string
			nonce, sealed, ad []byte
		}{"ciphertext", nonce, append(flip(sealed[:n]), sealed[n:]...), aad})
	}
	if len(aad) > 0 {
		cases = append(cases, struct {
			what              string
			nonce, sealed, ad []byte
		}{"aad", nonce, sealed, flip(aad)})
	}
	for _, c := range cases {
		dst := make([]byte, 0, len(c.sealed))
		got, err := a.Open(dst, c.nonce, c.sealed, c.ad)
		if err == nil || got != nil {
			t.Fatalf("n=%d: Open accepted a changed %s", n, c.what)
		}
		if plain := dst[:cap(dst)]; n > 0 && !bytes.Equal(plain, make([]byte, len(plain))) {
			t.Fatalf("n=%d: Open with a changed %s left data in dst", n, c.what)
		}
		inPlace := bytes.Clone(c.sealed)
		if _, err := a.Open(inPlace[:0], c.nonce, inPlace, c.ad); err == nil {
			t.Fatalf("n=%d: Open in place accepted a changed %s", n, c.what)
		}
		if n > 0 && bytes.Contains(inPlace, sealedPlain(a, nonce, sealed, aad)) {
			t.Fatalf("n=%d: Open in place with a changed %s left the plaintext", n, c.what)
		}
	}
}

// sealedPlain returns the plaintext of a genuine sealed message.
func sealedPlain(a cipher.AEAD, nonce, sealed, aad []byte) []byte {
	pt, err := a.Open(nil, nonce, sealed, aad)
	if err != nil {
		panic(err)
	}
	return pt
}

// TestShortAndBad checks the inputs x/crypto refuses or panics on.
func TestShortAndBad(t *testing.T) {
	need(t)
	if _, err := New(make([]byte, 31)); err == nil {
		t.Error("New accepted a 31-byte key")
	}
	a, err := New(make([]byte, KeySize))
	if err != nil {
		t.Fatal(err)
	}
	if a.NonceSize() != 12 || a.Overhead() != 16 {
		t.Errorf("NonceSize %d, Overhead %d; want 12, 16", a.NonceSize(), a.Overhead())
	}
	for n := 0; n < Overhead; n++ {
		if _, err := a.Open(nil, make([]byte, NonceSize), make([]byte, n), nil); err == nil {
			t.Errorf("Open accepted %d bytes", n)
		}
	}
	mustPanic(t, "short nonce", func() { a.Seal(nil, make([]byte, 8), nil, nil) })
	buf := make([]byte, 100)
	mustPanic(t, "overlap", func() { a.Seal(buf[1:1], make([]byte, NonceSize), buf[:50], nil) })
}

func mustPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if recover() == nil {
			t.Errorf("%s: no panic", what)
		}
	}()
	f()
}
