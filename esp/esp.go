// Package esp is the ESP wire format (RFC 4303) in tunnel mode: it
// encapsulates inner IPv4 and IPv6 packets behind an outer IPv4 or IPv6
// header, optionally inside UDP (RFC 3948), and decapsulates them with the
// padding, extended sequence number (ESN) and anti-replay rules of RFC 4303
// and the ECN rules of RFC 6040. Confidentiality and integrity come from a
// crypto.Transform.
//
// Everything here works in place on byte slices: no I/O, and no allocation
// per packet. A packet buffer has MaxHeadroom bytes before the inner packet
// and MaxTrailer bytes (plus any TFC padding) after it, so Encapsulate can
// write the outer headers in front and the trailer behind without copying.
package esp

import (
	"encoding/binary"
	"errors"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/packet"
)

// MaxHeadroom is the room an inner packet needs in front of it for the
// largest framing: outer IPv6 (40), UDP (8), ESP header (8) and IV (16).
const MaxHeadroom = 80

// MaxTrailer is the room an inner packet needs behind it for the largest
// trailer without TFC padding: padding (up to 15), Pad Length, Next Header
// and ICV (up to 32).
const MaxTrailer = 64

// HeaderLen is the length of the ESP header: SPI and sequence number.
const HeaderLen = crypto.HeaderLen

// Next Header values carried in the ESP trailer.
const (
	NextHeaderIPv4  = packet.ProtoIPIP   // tunnel mode, IPv4 inner packet
	NextHeaderIPv6  = packet.ProtoIPv6   // tunnel mode, IPv6 inner packet
	NextHeaderDummy = packet.ProtoNoNext // dummy packet (RFC 4303 section 2.6)
)

// Errors that Encapsulate, Open and Replay.Update return, one per reason, so
// that the data path can count drops by reason. Open also passes
// crypto.ErrAuthentication through unchanged.
var (
	// ErrReplay means the sequence number is 0, older than the replay
	// window, or already received.
	ErrReplay = errors.New("esp: replayed or too old sequence number")
	// ErrPadding means the Pad Length does not fit the payload or the
	// padding bytes are not 1, 2, 3, ... (RFC 4303 section 2.4).
	ErrPadding = errors.New("esp: bad padding")
	// ErrMalformed means the ESP packet is too short or its length does
	// not fit the transform's block size.
	ErrMalformed = errors.New("esp: malformed ESP packet")
	// ErrDummy means the packet is a valid dummy packet (Next Header 59):
	// drop it silently.
	ErrDummy = errors.New("esp: dummy packet")
	// ErrECNDrop means the outer header says Congestion Experienced while
	// the inner packet is not ECN-capable: RFC 6040 section 4.2 drops it.
	ErrECNDrop = errors.New("esp: CE on a Not-ECT inner packet")
	// ErrNextHeader means the Next Header is neither IPv4, IPv6 nor 59
	// (tunnel mode), or not an upper-layer protocol (transport mode).
	ErrNextHeader = errors.New("esp: unsupported next header")
	// ErrInner means the inner packet is malformed: too short, a version
	// that does not match the Next Header, or a length field past the
	// data.
	ErrInner = errors.New("esp: malformed inner packet")
	// ErrHeadroom means there is not enough room in front of the inner
	// packet for the outer headers.
	ErrHeadroom = errors.New("esp: not enough headroom for the outer headers")
	// ErrTailroom means the buffer's capacity cannot hold the trailer.
	ErrTailroom = errors.New("esp: not enough buffer capacity for the trailer")
	// ErrTooBig means the outer packet would exceed 65535 bytes.
	ErrTooBig = errors.New("esp: outer packet longer than 65535 bytes")
	// ErrOuter means the Outer addresses are missing or of different
	// families.
	ErrOuter = errors.New("esp: outer addresses invalid or of mixed families")
	// ErrTransport means a packet that transport mode cannot carry: a
	// fragment, an IPv4 header with options, an IPv6 header followed by
	// an extension header that belongs in front of ESP, or addresses
	// other than the SA's.
	ErrTransport = errors.New("esp: packet transport mode cannot carry")
)

// SPI returns the Security Parameters Index of the ESP packet pkt, which
// starts at the ESP header. ok is false if pkt is too short.
func SPI(pkt []byte) (spi uint32, ok bool) {
	if len(pkt) < 4 {
		return 0, false
	}
	return binary.BigEndian.Uint32(pkt[0:4]), true
}
