package sa

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/packet"
)

// fakeClock is an injectable clock that moves only when told.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// newTestDB returns a DB on a fake clock.
func newTestDB(t *testing.T) (*DB, *fakeClock) {
	t.Helper()
	c := newFakeClock()
	return NewDB(Options{Now: c.Now}), c
}

// keyPattern is what test keys are made of: easy to spot in any text,
// raw ("SeKr"), in hex (53654b72) or as decimal bytes (83 101 75 114).
var keyPattern = []byte("SeKr")

func testKey(n int) []byte {
	return bytes.Repeat(keyPattern, (n+3)/4)[:n]
}

var (
	gcm128    = crypto.Suite{Encryption: crypto.EncrAESGCM16, KeyBits: 128}
	gcm128ESN = crypto.Suite{Encryption: crypto.EncrAESGCM16, KeyBits: 128, ESN: true}
	cbcSHA256 = crypto.Suite{Encryption: crypto.EncrAESCBC, KeyBits: 256, Integrity: crypto.AuthHMACSHA2256128}
	local     = netip.MustParseAddr("198.18.0.1")
	remote    = netip.MustParseAddr("198.18.0.2")
)

// stateKey returns a test key of n bytes of its own for the state with
// this SPI and direction (every state needs its own key): the key pattern
// with the direction and the SPI in its last five bytes.
func testStateKey(n int, spi uint32, dir Direction) []byte {
	k := testKey(n)
	if n >= 5 {
		k[n-5] = byte(dir)
		binary.BigEndian.PutUint32(k[n-4:], spi)
	}
	return k
}

// testConfig returns a valid state between local and remote, with a key
// of its own.
func testConfig(spi uint32, dir Direction, reqid uint32) Config {
	c := Config{SPI: spi, Dir: dir, Src: local, Dst: remote, Suite: gcm128,
		EncKey: testStateKey(gcm128.EncKeyLen(), spi, dir), ReqID: reqid, ReplayWindow: 64}
	if dir == DirIn {
		c.Src, c.Dst = remote, local
	}
	return c
}

func mustAdd(t testing.TB, db *DB, c Config) *SA {
	t.Helper()
	s, err := db.AddSA(c)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// innerPacket returns a buffer holding an IPv4/UDP packet of the flow at
// offset off, with room for a trailer.
func innerPacket(t testing.TB, f packet.Flow, payload int, off int) ([]byte, int) {
	t.Helper()
	n := packet.IPv4HeaderLen + 8 + payload
	buf := make([]byte, off+n+256)
	if _, err := packet.PutIPv4Header(buf[off:], packet.IPv4Header{TotalLen: uint16(n), TTL: 64, Protocol: f.Proto, Src: f.Src, Dst: f.Dst}); err != nil {
		t.Fatal(err)
	}
	if _, err := packet.PutUDPHeader(buf[off+packet.IPv4HeaderLen:], f.SrcPort, f.DstPort, payload); err != nil {
		t.Fatal(err)
	}
	return buf[:off+n], n
}

// watchZero wraps newTransform for the test so that Zero calls are seen.
func watchZero(t *testing.T) func(s *SA) bool {
	t.Helper()
	orig := newTransform
	t.Cleanup(func() { newTransform = orig })
	newTransform = func(s crypto.Suite, ek, ik []byte) (crypto.Transform, error) {
		tr, err := orig(s, ek, ik)
		if err != nil {
			return nil, err
		}
		return &zeroWatch{Transform: tr}, nil
	}
	return func(s *SA) bool { return watched(s).zeros.Load() > 0 }
}

// watched returns the zeroWatch of a state built under watchZero.
func watched(s *SA) *zeroWatch { return s.transform.(*zeroWatch) }

// zeroWatch counts the Zero calls of a transform, and the Seal and Open
// calls that overlap a Zero or follow it (which a state's holders must
// never make).
type zeroWatch struct {
	crypto.Transform
	zeros    atomic.Int32
	busy     atomic.Int32 // Seal and Open calls in progress
	misuses  atomic.Int32 // Seal or Open after, or during, Zero
	overlaps atomic.Int32 // Zero during Seal or Open
}

func (z *zeroWatch) Zero() {
	if z.busy.Load() != 0 {
		z.overlaps.Add(1)
	}
	z.zeros.Add(1)
	z.Transform.Zero()
}

func (z *zeroWatch) enter() {
	z.busy.Add(1)
	if z.zeros.Load() != 0 {
		z.misuses.Add(1)
	}
}

func (z *zeroWatch) leave() {
	if z.zeros.Load() != 0 {
		z.misuses.Add(1)
	}
	z.busy.Add(-1)
}

func (z *zeroWatch) Seal(pkt []byte, seq uint64) {
	z.enter()
	defer z.leave()
	z.Transform.Seal(pkt, seq)
}

func (z *zeroWatch) Open(pkt []byte, seq uint64) ([]byte, error) {
	z.enter()
	defer z.leave()
	return z.Transform.Open(pkt, seq)
}

// keysZero reports whether every byte slice the state holds outside its
// transform is zero (there should be none: the state keeps no key copy).
func keysZero(s *SA) bool {
	v := reflect.ValueOf(s).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		if f.Kind() == reflect.Slice && f.Type().Elem().Kind() == reflect.Uint8 {
			for _, b := range f.Bytes() {
				if b != 0 {
					return false
				}
			}
		}
	}
	return true
}

// nextEvent waits briefly for an event.
func nextEvent(t *testing.T, sub *Subscription) Event {
	t.Helper()
	select {
	case ev := <-sub.Events():
		return ev
	case <-time.After(5 * time.Second):
		t.Fatal("no event within 5 s")
	}
	return Event{}
}

// noEvent checks that no event is queued.
func noEvent(t *testing.T, sub *Subscription) {
	t.Helper()
	select {
	case ev := <-sub.Events():
		t.Fatalf("unexpected event %v", ev)
	default:
	}
}

// setSeq makes s, an outbound state, have handed out up to used, with
// everything up to its last number reserved.
func setSeq(s *SA, used uint64) {
	s.seqUsed.Store(used)
	s.seqLimit.Store(s.seqMax)
	s.seqExtAt.Store(s.seqMax)
}
