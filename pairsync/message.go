package pairsync

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/espd/espd/crypto"
)

// KeyLen is the length of the pair's key.
const KeyLen = 32

// Key is the pair's shared key, or one direction's key derived from it
// (Direction), which authenticates messages with HMAC-SHA256.
type Key [KeyLen]byte

// Direction returns the key of what node from (1 or 2) sends to the other:
// HKDF-SHA256 of k with a label naming the direction. A node MACs with its
// own direction's key and verifies with the other's, so a message sent
// back to its sender is not authentic.
func (k *Key) Direction(from int) Key {
	var d Key
	info := fmt.Sprintf("espd pair link v2: node %d to node %d", from, 3-from)
	b, err := hkdf.Key(sha256.New, k[:], nil, info, KeyLen)
	if err != nil { // cannot happen: KeyLen is far below HKDF's limit
		panic(err)
	}
	copy(d[:], b)
	clear(b)
	return d
}

// Digest names a pair's parameters (Params.Digest).
type Digest [16]byte

// MaxLocals is how many addresses of its own (Message.Locals) a node
// may declare.
const MaxLocals = 16

// Type is a message's kind.
type Type uint8

// Message types.
const (
	TypeReserve Type = 1 // outbound reservations, to be acknowledged
	TypeAck     Type = 2 // the reservations of one Reserve, recorded
	TypeWindows Type = 3 // inbound replay windows
	TypeHello   Type = 4 // the standby's stamp, for the lease
	TypeOwn     Type = 5 // a standby's own reservations: the most it may have sent
)

func (t Type) String() string {
	switch t {
	case TypeReserve:
		return "reserve"
	case TypeAck:
		return "ack"
	case TypeWindows:
		return "windows"
	case TypeHello:
		return "hello"
	case TypeOwn:
		return "own"
	}
	return fmt.Sprintf("type %d", uint8(t))
}

// Wire constants.
const (
	magic   = "ESPP"
	version = 2
	// magic, version, type, count, node, locals, params, then epoch,
	// counter, stamp, peer epoch, echo; the locals (16 bytes each) follow.
	headerLen  = 4 + 1 + 1 + 2 + 1 + 1 + len(Digest{}) + 5*8
	localLen   = 16
	macLen     = sha256.Size
	reserveLen = len(crypto.Fingerprint{}) + 8
	// MaxMessage is the largest message Encode makes and Decode takes:
	// what one UDP datagram carries.
	MaxMessage = 65507
	// MaxBitmap is the largest replay bitmap a window report carries, in
	// bytes: a window of 65536 numbers, espd's largest.
	MaxBitmap = 65536 / 8
)

// Reservation says that sequence numbers up to Limit may be sent with the
// key whose fingerprint is FP.
type Reservation struct {
	FP    crypto.Fingerprint
	Limit uint64
}

// Window is an inbound key's replay state: Top, the highest number
// received, and Bitmap in esp.ReplayWindow.Bitmap's layout (bit i set:
// Top-i received).
type Window struct {
	FP     crypto.Fingerprint
	Top    uint64
	Bitmap []byte
}

// Message is one message of the pair.
type Message struct {
	Type Type
	// Node is the sender's node number (1 or 2); Params the digest of
	// the pair's parameters as the sender sees them; Locals the
	// sender's addresses of its own (--pair-local-addr). The receiver
	// refuses a message that disagrees with its own configuration.
	Node   uint8
	Params Digest
	Locals []netip.Addr
	// Epoch names the sender's run (random at start); Counter numbers
	// its messages within it, increasing.
	Epoch, Counter uint64
	// Stamp is the sender's monotonic clock when it sent the message
	// (nanoseconds since its start). Echo is the latest Stamp the sender
	// had received from the other node, whose run was PeerEpoch (0: none
	// yet). An echo of the standby's own stamp bounds, on the standby's
	// clock, how long ago the active sent what the message says: the
	// lease a takeover relies on (doc.go).
	Stamp, PeerEpoch, Echo uint64
	// AckEpoch and AckCounter: for TypeAck, the request it answers.
	AckEpoch, AckCounter uint64
	// Reservations: TypeReserve, TypeAck and TypeOwn.
	Reservations []Reservation
	// Windows: TypeWindows.
	Windows []Window
}

// Errors of Decode.
var (
	ErrShort   = errors.New("pairsync: message too short")
	ErrMagic   = errors.New("pairsync: not a pair message")
	ErrVersion = errors.New("pairsync: unknown version")
	ErrAuth    = errors.New("pairsync: message not authentic")
	ErrFormat  = errors.New("pairsync: malformed message")
	ErrTooLong = errors.New("pairsync: message too long")
)

// Append appends m, authenticated with k, to b and returns the result. It
// fails if m does not fit MaxMessage or is not well formed.
func (m *Message) Append(b []byte, k *Key) ([]byte, error) {
	var count int
	switch m.Type {
	case TypeReserve, TypeAck, TypeOwn:
		count = len(m.Reservations)
		if len(m.Windows) != 0 {
			return nil, fmt.Errorf("%w: %v with windows", ErrFormat, m.Type)
		}
	case TypeWindows:
		count = len(m.Windows)
		if len(m.Reservations) != 0 {
			return nil, fmt.Errorf("%w: windows with reservations", ErrFormat)
		}
	case TypeHello:
		if len(m.Reservations)+len(m.Windows) != 0 {
			return nil, fmt.Errorf("%w: hello with a body", ErrFormat)
		}
	default:
		return nil, fmt.Errorf("%w: %v", ErrFormat, m.Type)
	}
	if count > 0xffff {
		return nil, ErrTooLong
	}
	if len(m.Locals) > MaxLocals {
		return nil, fmt.Errorf("%w: %d local addresses", ErrFormat, len(m.Locals))
	}
	start := len(b)
	b = append(b, magic...)
	b = append(b, version, byte(m.Type))
	b = binary.BigEndian.AppendUint16(b, uint16(count))
	b = append(b, m.Node, byte(len(m.Locals)))
	b = append(b, m.Params[:]...)
	b = binary.BigEndian.AppendUint64(b, m.Epoch)
	b = binary.BigEndian.AppendUint64(b, m.Counter)
	b = binary.BigEndian.AppendUint64(b, m.Stamp)
	b = binary.BigEndian.AppendUint64(b, m.PeerEpoch)
	b = binary.BigEndian.AppendUint64(b, m.Echo)
	for _, a := range m.Locals {
		a16 := a.As16()
		b = append(b, a16[:]...)
	}
	if m.Type == TypeAck {
		b = binary.BigEndian.AppendUint64(b, m.AckEpoch)
		b = binary.BigEndian.AppendUint64(b, m.AckCounter)
	}
	for _, r := range m.Reservations {
		b = append(b, r.FP[:]...)
		b = binary.BigEndian.AppendUint64(b, r.Limit)
	}
	for _, w := range m.Windows {
		if len(w.Bitmap) > MaxBitmap {
			return nil, fmt.Errorf("%w: bitmap of %d bytes", ErrFormat, len(w.Bitmap))
		}
		b = append(b, w.FP[:]...)
		b = binary.BigEndian.AppendUint64(b, w.Top)
		b = binary.BigEndian.AppendUint16(b, uint16(len(w.Bitmap)))
		b = append(b, w.Bitmap...)
	}
	if len(b)-start+macLen > MaxMessage {
		return nil, ErrTooLong
	}
	return appendMAC(b, start, k), nil
}

// appendMAC appends to b the HMAC-SHA256 under k of b[from:].
func appendMAC(b []byte, from int, k *Key) []byte {
	mac := hmac.New(sha256.New, k[:])
	mac.Write(b[from:])
	return mac.Sum(b)
}

// check returns nil if b is a message of this version, authentic under k.
func check(b []byte, k *Key) error {
	if len(b) > MaxMessage {
		return ErrTooLong
	}
	if len(b) < headerLen+macLen {
		return ErrShort
	}
	if string(b[:4]) != magic {
		return ErrMagic
	}
	if b[4] != version {
		return fmt.Errorf("%w %d", ErrVersion, b[4])
	}
	body, sum := b[:len(b)-macLen], b[len(b)-macLen:]
	mac := hmac.New(sha256.New, k[:])
	mac.Write(body)
	if !hmac.Equal(mac.Sum(nil), sum) {
		return ErrAuth
	}
	return nil
}

// epochOf returns the Epoch field of b, a message check accepted.
func epochOf(b []byte) uint64 { return binary.BigEndian.Uint64(b[10+len(Digest{}):]) }

// Decode checks b's authenticity under k and returns its message. It
// never panics on any input; every error wraps one of the Err values.
func Decode(b []byte, k *Key) (Message, error) {
	var m Message
	if err := check(b, k); err != nil {
		return m, err
	}
	body := b[:len(b)-macLen]
	m.Type = Type(b[5])
	count := int(binary.BigEndian.Uint16(b[6:]))
	m.Node = b[8]
	nlocal := int(b[9])
	copy(m.Params[:], b[10:])
	h := b[10+len(m.Params):]
	m.Epoch = binary.BigEndian.Uint64(h)
	m.Counter = binary.BigEndian.Uint64(h[8:])
	m.Stamp = binary.BigEndian.Uint64(h[16:])
	m.PeerEpoch = binary.BigEndian.Uint64(h[24:])
	m.Echo = binary.BigEndian.Uint64(h[32:])
	p := body[headerLen:]
	if nlocal > MaxLocals || len(p) < nlocal*localLen {
		return Message{}, fmt.Errorf("%w: %d local addresses", ErrFormat, nlocal)
	}
	for range nlocal {
		m.Locals = append(m.Locals, netip.AddrFrom16([16]byte(p[:localLen])).Unmap())
		p = p[localLen:]
	}
	switch m.Type {
	case TypeAck:
		if len(p) < 16 {
			return Message{}, fmt.Errorf("%w: ack without its request", ErrFormat)
		}
		m.AckEpoch, m.AckCounter = binary.BigEndian.Uint64(p), binary.BigEndian.Uint64(p[8:])
		p = p[16:]
		fallthrough
	case TypeReserve, TypeOwn:
		if len(p) != count*reserveLen {
			return Message{}, fmt.Errorf("%w: %d bytes for %d reservations", ErrFormat, len(p), count)
		}
		if count > 0 {
			m.Reservations = make([]Reservation, count)
		}
		for i := range m.Reservations {
			r := &m.Reservations[i]
			copy(r.FP[:], p)
			r.Limit = binary.BigEndian.Uint64(p[len(r.FP):])
			p = p[reserveLen:]
		}
	case TypeWindows:
		for range count {
			var w Window
			if len(p) < len(w.FP)+10 {
				return Message{}, fmt.Errorf("%w: window record cut short", ErrFormat)
			}
			copy(w.FP[:], p)
			w.Top = binary.BigEndian.Uint64(p[len(w.FP):])
			n := int(binary.BigEndian.Uint16(p[len(w.FP)+8:]))
			p = p[len(w.FP)+10:]
			if n > MaxBitmap || n > len(p) {
				return Message{}, fmt.Errorf("%w: bitmap of %d bytes", ErrFormat, n)
			}
			if n > 0 {
				w.Bitmap = append([]byte(nil), p[:n]...)
			}
			p = p[n:]
			m.Windows = append(m.Windows, w)
		}
		if len(p) != 0 {
			return Message{}, fmt.Errorf("%w: %d bytes after the windows", ErrFormat, len(p))
		}
	case TypeHello:
		if count != 0 || len(p) != 0 {
			return Message{}, fmt.Errorf("%w: hello with a body", ErrFormat)
		}
	default:
		return Message{}, fmt.Errorf("%w: %v", ErrFormat, m.Type)
	}
	return m, nil
}
