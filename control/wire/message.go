package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Header is the fixed 16-byte header that starts every message.
type Header struct {
	Version uint8
	Flags   Flags
	Type    MsgType
	// Length is the length of the whole message, header included.
	Length uint32
	Seq    uint32
}

// Message is a decoded message: its header fields and its top-level
// attributes. Nested attributes are parsed by the typed decoders.
type Message struct {
	Version uint8
	Type    MsgType
	Flags   Flags
	Seq     uint32
	Attrs   []Attr
}

// Framing errors: after one of these the byte stream cannot be resynchronized.
var (
	// ErrBadMagic means the header does not start with Magic.
	ErrBadMagic = errors.New("bad magic")
	// ErrFraming means the Length field cannot delimit a message.
	ErrFraming = errors.New("bad message length")
)

// ParseHeader decodes and checks the fixed header at the start of b. It
// checks what the stream framing depends on: the magic, that Length covers at
// least the header and is a multiple of 4. It does not check the Reserved
// field (Decode does) nor Length against MaxMessageSize (see
// Header.Oversized).
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderLen {
		return Header{}, fmt.Errorf("truncated header: %d of %d bytes", len(b), HeaderLen)
	}
	if m := binary.BigEndian.Uint16(b); m != Magic {
		return Header{}, fmt.Errorf("%w 0x%04x, want 0x%04x", ErrBadMagic, m, Magic)
	}
	h := Header{
		Version: b[2],
		Flags:   Flags(b[3]),
		Type:    MsgType(binary.BigEndian.Uint16(b[4:])),
		Length:  binary.BigEndian.Uint32(b[8:]),
		Seq:     binary.BigEndian.Uint32(b[12:]),
	}
	if h.Length < HeaderLen {
		return h, fmt.Errorf("%w %d: shorter than the %d-byte header", ErrFraming, h.Length, HeaderLen)
	}
	if h.Length%4 != 0 {
		return h, fmt.Errorf("%w %d: not a multiple of 4", ErrFraming, h.Length)
	}
	return h, nil
}

// Oversized reports whether the message is larger than MaxMessageSize.
func (h Header) Oversized() bool { return h.Length > MaxMessageSize }

// Decode decodes one complete message. It rejects, with an error naming the
// problem, a truncated or oversized message, a Length that disagrees with
// len(b), misaligned or overrunning attributes and non-zero padding.
func Decode(b []byte) (*Message, error) {
	h, err := ParseHeader(b)
	if err != nil {
		return nil, err
	}
	if h.Oversized() {
		return nil, fmt.Errorf("message of %d bytes exceeds the maximum of %d", h.Length, MaxMessageSize)
	}
	if int(h.Length) > len(b) {
		return nil, fmt.Errorf("truncated message: length %d, %d bytes present", h.Length, len(b))
	}
	if int(h.Length) < len(b) {
		return nil, fmt.Errorf("message length %d, but %d bytes given", h.Length, len(b))
	}
	if r := binary.BigEndian.Uint16(b[6:]); r != 0 {
		return nil, fmt.Errorf("reserved header field is 0x%04x, must be zero", r)
	}
	attrs, err := ParseAttrs(b[HeaderLen:])
	if err != nil {
		return nil, err
	}
	return &Message{Version: h.Version, Type: h.Type, Flags: h.Flags, Seq: h.Seq, Attrs: attrs}, nil
}
