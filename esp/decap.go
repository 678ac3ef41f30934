package esp

import (
	"encoding/binary"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/packet"
)

// Decapsulator opens the ESP packets of one inbound SA. Its fields are set
// once and read concurrently by many workers.
type Decapsulator struct {
	Transform crypto.Transform
	// Replay is the SA's anti-replay window, which also infers ESN high
	// bits. nil means no replay check and 32-bit sequence numbers; an ESN
	// SA needs a window (NewReplayWindow(0, true) if checks are off).
	Replay *ReplayWindow
	// ECN applies RFC 6040 decapsulation to the inner ECN field; false
	// leaves the inner packet's ECN field alone.
	ECN bool
	// UDPEncap says the SA's packets arrive in UDP (RFC 3948), perhaps
	// through a NAT: OpenTransport then recomputes the inner TCP and UDP
	// checksums (natChecksum).
	UDPEncap bool
}

// Open checks, verifies and decrypts the ESP packet pkt, which starts at
// the SPI and ends with the ICV, in place, without recording it in the
// replay window. It returns the inner packet (a sub-slice of pkt, trimmed
// to its own length field, which drops any TFC padding) and the full
// sequence number. outerTOS is the TOS or Traffic Class of the outer IP
// header, for RFC 6040.
//
// In order: lengths are checked (ErrMalformed); the sequence number is
// inferred from the window's highest recorded number and checked against
// the window (ErrReplay) before decrypting; the transform verifies and
// decrypts (crypto.ErrAuthentication passes through); the trailer is
// checked (ErrPadding, ErrNextHeader); a dummy packet gives ErrDummy; the
// inner packet is checked (ErrInner); with ECN, Congestion Experienced on a
// Not-ECT inner packet gives ErrECNDrop, otherwise the inner ECN field is
// updated per RFC 6040 section 4.2 (with the IPv4 checksum).
//
// The window's Check only says the number was not recorded yet: the caller
// records each packet for which Authentic(err) holds with Replay.Update,
// which has the last word on duplicates. Opening the same packet twice
// before it is recorded succeeds twice. Callers that open in parallel and
// record in arrival order (as the kernel's pcrypt does) keep a fast worker
// from pushing a slow worker's packets out of the window; the others call
// Replay.Update right after Open. Open is safe for concurrent use.
func (d *Decapsulator) Open(pkt []byte, outerTOS uint8) (inner []byte, seq uint64, err error) {
	payload, nh, seq, err := d.open(pkt)
	if err != nil {
		return nil, seq, err
	}
	switch nh {
	case NextHeaderDummy:
		return nil, seq, ErrDummy
	case NextHeaderIPv4:
		if len(payload) < packet.IPv4HeaderLen || payload[0]>>4 != 4 {
			return nil, seq, ErrInner
		}
		tl := int(binary.BigEndian.Uint16(payload[2:4]))
		if tl < int(payload[0]&0x0f)*4 || tl < packet.IPv4HeaderLen || tl > len(payload) {
			return nil, seq, ErrInner
		}
		inner = payload[:tl]
	case NextHeaderIPv6:
		if len(payload) < packet.IPv6HeaderLen || payload[0]>>4 != 6 {
			return nil, seq, ErrInner
		}
		tl := packet.IPv6HeaderLen + int(binary.BigEndian.Uint16(payload[4:6]))
		if tl > len(payload) {
			return nil, seq, ErrInner
		}
		inner = payload[:tl]
	default:
		return nil, seq, ErrNextHeader
	}
	if d.ECN {
		ecn, drop := decapECN(outerTOS&packet.ECNMask, inner)
		if drop {
			return nil, seq, ErrECNDrop
		}
		packet.SetECN(inner, ecn)
	}
	return inner, seq, nil
}

// open checks, verifies and decrypts pkt in place, as Open does up to and
// including the trailer, and returns the payload and its Next Header.
func (d *Decapsulator) open(pkt []byte) (payload []byte, nh uint8, seq uint64, err error) {
	t := d.Transform
	iv, icv, bs := t.IVSize(), t.ICVSize(), t.BlockSize()
	plain := len(pkt) - HeaderLen - iv - icv
	if plain < bs || plain%bs != 0 {
		return nil, 0, 0, ErrMalformed
	}
	seq = uint64(binary.BigEndian.Uint32(pkt[4:8]))
	if d.Replay != nil {
		seq = d.Replay.Infer(uint32(seq))
		if err := d.Replay.Check(seq); err != nil {
			return nil, 0, seq, err
		}
	}
	pt, err := t.Open(pkt, seq)
	if err != nil {
		if err == crypto.ErrMalformed {
			err = ErrMalformed
		}
		return nil, 0, seq, err
	}
	if len(pt) < 2 {
		return nil, 0, seq, ErrMalformed
	}
	nh = pt[len(pt)-1]
	pl := int(pt[len(pt)-2])
	if pl+2 > len(pt) {
		return nil, 0, seq, ErrPadding
	}
	payload = pt[:len(pt)-2-pl]
	for i, b := range pt[len(payload) : len(pt)-2] {
		if b != byte(i+1) {
			return nil, 0, seq, ErrPadding
		}
	}
	return payload, nh, seq, nil
}

// Authentic reports whether an error of Open leaves the packet authentic:
// nil, ErrDummy or ErrECNDrop. Its sequence number must then be recorded
// in the replay window, even though dummy and ECN-dropped packets go no
// further.
func Authentic(err error) bool {
	return err == nil || err == ErrDummy || err == ErrECNDrop
}

// decapECN returns the inner ECN field after decapsulation (RFC 6040
// section 4.2) given the outer ECN field, or drop when the outer field is
// CE and the inner packet is Not-ECT.
func decapECN(outer uint8, inner []byte) (ecn uint8, drop bool) {
	in, _ := packet.ECN(inner)
	switch {
	case outer == packet.ECNCE && in == packet.ECNNotECT:
		return in, true
	case outer == packet.ECNCE:
		return packet.ECNCE, false
	case outer == packet.ECNECT1 && in == packet.ECNECT0:
		return packet.ECNECT1, false
	}
	return in, false
}
