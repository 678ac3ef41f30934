package pairsync

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"

	"github.com/espd/espd/crypto"
)

var testKey = Key{1, 2, 3, 4, 5, 6, 7, 8}

func fp(b byte) crypto.Fingerprint { return crypto.Fingerprint{b, b ^ 0x5a, 7} }

func sampleMessages() []Message {
	return []Message{
		{Type: TypeReserve, Epoch: 0x1122334455667788, Counter: 1, Stamp: 5e9, PeerEpoch: 0xabcdef, Echo: 4e9,
			Reservations: []Reservation{{fp(1), 1 << 20}, {fp(2), 1<<40 + 5}}},
		{Type: TypeReserve, Epoch: 9, Counter: 2},
		{Type: TypeAck, Epoch: 3, Counter: 77, AckEpoch: 0x1122334455667788, AckCounter: 1,
			Reservations: []Reservation{{fp(1), 1 << 20}}},
		{Type: TypeWindows, Epoch: 9, Counter: 3, Windows: []Window{
			{FP: fp(3), Top: 1000, Bitmap: []byte{0xff, 0x0f, 0, 0x80}},
			{FP: fp(4), Top: 5},
			{FP: fp(5), Top: 1 << 33, Bitmap: bytes.Repeat([]byte{0xa5}, MaxBitmap)},
		}},
		{Type: TypeHello, Epoch: 4, Counter: 8, Stamp: 1e9, PeerEpoch: 9, Echo: 2e9},
		{Type: TypeHello, Node: 2, Params: Digest{1, 2, 3}, Epoch: 5, Counter: 9,
			Locals: []netip.Addr{netip.MustParseAddr("198.18.3.2"), netip.MustParseAddr("2001:db8::2")}},
	}
}

// TestDirectionKeys: each direction has its own key, neither the pair's,
// the same on both nodes; a message under one is not authentic under the
// other.
func TestDirectionKeys(t *testing.T) {
	k12, k21 := testKey.Direction(1), testKey.Direction(2)
	if k12 == k21 || k12 == testKey || k21 == testKey || k12 != testKey.Direction(1) {
		t.Fatal("the direction keys are not distinct and deterministic")
	}
	b, err := (&Message{Type: TypeHello, Node: 1}).Append(nil, &k12)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Decode(b, &k21); !errors.Is(err, ErrAuth) {
		t.Fatalf("a message of node 1 decoded under node 2's key: %v", err)
	}
	if _, err := Decode(b, &k12); err != nil {
		t.Fatal(err)
	}
}

// TestRoundTrip: every message type decodes to what was encoded.
func TestRoundTrip(t *testing.T) {
	for _, m := range sampleMessages() {
		b, err := m.Append(nil, &testKey)
		if err != nil {
			t.Fatalf("%v: %v", m.Type, err)
		}
		got, err := Decode(b, &testKey)
		if err != nil {
			t.Fatalf("%v: %v", m.Type, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("%v: decoded\n%+v\nwant\n%+v", m.Type, got, m)
		}
		// Appending to a buffer leaves what was in it.
		b2, err := m.Append([]byte("prefix"), &testKey)
		if err != nil || !bytes.Equal(b2[6:], b) || string(b2[:6]) != "prefix" {
			t.Errorf("%v: Append to a buffer: %v", m.Type, err)
		}
	}
}

// TestTampered: any changed byte, a wrong key, a cut or an extended
// message is refused, with the error its kind.
func TestTampered(t *testing.T) {
	m := sampleMessages()[0]
	b, err := m.Append(nil, &testKey)
	if err != nil {
		t.Fatal(err)
	}
	for i := range b {
		c := bytes.Clone(b)
		c[i] ^= 0x40
		_, err := Decode(c, &testKey)
		want := ErrAuth
		switch {
		case i < 4:
			want = ErrMagic
		case i == 4:
			want = ErrVersion
		}
		if !errors.Is(err, want) {
			t.Errorf("byte %d flipped: %v, want %v", i, err, want)
		}
	}
	other := testKey
	other[31] = 1
	if _, err := Decode(b, &other); !errors.Is(err, ErrAuth) {
		t.Errorf("another key: %v", err)
	}
	for _, n := range []int{0, 10, headerLen + macLen - 1} {
		if _, err := Decode(b[:n], &testKey); !errors.Is(err, ErrShort) {
			t.Errorf("cut to %d bytes: %v", n, err)
		}
	}
	if _, err := Decode(b[:len(b)-1], &testKey); !errors.Is(err, ErrAuth) {
		t.Errorf("one byte short: %v", err)
	}
	if _, err := Decode(append(bytes.Clone(b), 0), &testKey); !errors.Is(err, ErrAuth) {
		t.Errorf("one byte more: %v", err)
	}
}

// TestMalformedAuthentic: authentic messages whose body does not parse
// (as a peer with a bug would send) are refused as ErrFormat.
func TestMalformedAuthentic(t *testing.T) {
	seal := func(body []byte) []byte {
		m := Message{Type: TypeReserve}
		b, _ := m.Append(nil, &testKey)
		b = append(b[:headerLen:headerLen], body...)
		return resign(b)
	}
	for name, b := range map[string][]byte{
		"reserve count too high": func() []byte { b := seal(make([]byte, reserveLen)); b[7] = 2; return resign(b[:len(b)-macLen]) }(),
		"reserve extra byte":     seal(make([]byte, reserveLen+1)),
		"unknown type":           func() []byte { b := seal(nil); b[5] = 9; return resign(b[:len(b)-macLen]) }(),
		"ack without request": func() []byte {
			b := seal(make([]byte, 8))
			b[5] = byte(TypeAck)
			b[7] = 0
			return resign(b[:len(b)-macLen])
		}(),
		"window bitmap beyond the end": func() []byte {
			body := make([]byte, 32+10)
			body[40], body[41] = 0, 5
			b := seal(body)
			b[5], b[7] = byte(TypeWindows), 1
			return resign(b[:len(b)-macLen])
		}(),
		"window bitmap too long": func() []byte {
			n := MaxBitmap + 1
			body := make([]byte, 32+10+n)
			body[40], body[41] = byte(n>>8), byte(n)
			b := seal(body)
			b[5], b[7] = byte(TypeWindows), 1
			return resign(b[:len(b)-macLen])
		}(),
	} {
		if _, err := Decode(b, &testKey); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: %v, want ErrFormat", name, err)
		}
	}
	if _, err := (&Message{Type: TypeWindows, Windows: []Window{{Bitmap: make([]byte, MaxBitmap+1)}}}).Append(nil, &testKey); !errors.Is(err, ErrFormat) {
		t.Errorf("Append with a bitmap too long: %v", err)
	}
	if _, err := (&Message{Type: TypeReserve, Reservations: make([]Reservation, 3000)}).Append(nil, &testKey); !errors.Is(err, ErrTooLong) {
		t.Errorf("Append beyond MaxMessage: %v", err)
	}
}

// resign returns body with a fresh MAC under testKey (body is a whole
// message without its MAC).
func resign(body []byte) []byte { return appendMAC(bytes.Clone(body), 0, &testKey) }

// FuzzDecode: Decode never panics, and what it accepts encodes back to
// the same bytes.
func FuzzDecode(f *testing.F) {
	for _, m := range sampleMessages() {
		b, _ := m.Append(nil, &testKey)
		f.Add(b[:len(b)-macLen])
	}
	f.Add([]byte("ESPP"))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, b := range [][]byte{body, appendMAC(bytes.Clone(body), 0, &testKey)} {
			m, err := Decode(b, &testKey)
			if err != nil {
				continue
			}
			again, err := m.Append(nil, &testKey)
			if err != nil || !bytes.Equal(again, b) {
				t.Fatalf("accepted %x, encodes back to %x (%v)", b, again, err)
			}
		}
	})
}

// TestRandomRoundTrip: random well-formed messages survive the wire.
func TestRandomRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		m := Message{Type: Type(1 + r.IntN(3)), Epoch: r.Uint64(), Counter: r.Uint64(), Stamp: r.Uint64(), PeerEpoch: r.Uint64(), Echo: r.Uint64()}
		if m.Type == TypeAck {
			m.AckEpoch, m.AckCounter = r.Uint64(), r.Uint64()
		}
		for range r.IntN(5) {
			var f crypto.Fingerprint
			f[r.IntN(32)] = byte(r.Uint32())
			if m.Type == TypeWindows {
				var bm []byte
				if n := r.IntN(64); n > 0 {
					bm = make([]byte, n)
					for i := range bm {
						bm[i] = byte(r.Uint32())
					}
				}
				m.Windows = append(m.Windows, Window{FP: f, Top: r.Uint64(), Bitmap: bm})
			} else {
				m.Reservations = append(m.Reservations, Reservation{f, r.Uint64()})
			}
		}
		b, err := m.Append(nil, &testKey)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(b, &testKey)
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Fatalf("%+v: decoded %+v, %v", m, got, err)
		}
	}
}
