package packet

import (
	"encoding/binary"
	"errors"
)

// Errors returned by FragmentIPv4.
var (
	// ErrDontFragment means the packet is longer than the MTU and has DF
	// set: send an ICMP "fragmentation needed" instead.
	ErrDontFragment = errors.New("packet: DF set on a packet larger than the MTU")
	// ErrOptions means the IPv4 options are malformed.
	ErrOptions = errors.New("packet: malformed IPv4 options")
	// ErrFragmentMTU means the MTU leaves no room for eight bytes of
	// payload per fragment.
	ErrFragmentMTU = errors.New("packet: MTU too small to fragment")
)

// FragmentIPv4 splits the IPv4 packet pkt into fragments of at most mtu
// bytes (RFC 791 section 3.2): every fragment's data but the last is a
// multiple of 8 bytes, MF is set on all but the last (and on the last too
// if pkt was itself a non-last fragment), offsets continue those of pkt,
// the first fragment keeps all options and later ones only those with the
// copied flag, and every header checksum is recomputed. Fragments are
// written into the buffers of frags, each resliced to its fragment's length
// (only their capacity matters), and the number of fragments is returned.
// A packet that already fits is copied into frags[0] unchanged. A packet
// with DF set that does not fit gives ErrDontFragment; too few or too small
// buffers give ErrShortBuffer before anything is written.
func FragmentIPv4(frags [][]byte, pkt []byte, mtu int) (int, error) {
	hl, tl, err := ipv4Lengths(pkt)
	if err != nil {
		return 0, err
	}
	if tl <= mtu {
		if len(frags) < 1 || cap(frags[0]) < tl {
			return 0, ErrShortBuffer
		}
		frags[0] = frags[0][:tl]
		copy(frags[0], pkt[:tl])
		return 1, nil
	}
	ff := binary.BigEndian.Uint16(pkt[6:8])
	if ff&IPv4DontFragment != 0 {
		return 0, ErrDontFragment
	}
	hl2, err := copiedOptionsLen(pkt[IPv4HeaderLen:hl])
	if err != nil {
		return 0, err
	}
	hl2 += IPv4HeaderLen
	d1, d2 := (mtu-hl)&^7, (mtu-hl2)&^7
	if mtu < 68 || d1 < 8 || d2 < 8 {
		return 0, ErrMTU
	}
	plen := tl - hl
	origOff := int(ff&ipv4OffsetMask) << 3
	if origOff+plen > 0xffff {
		return 0, ErrTotalLength
	}
	// Check every buffer before writing any.
	count := 1
	if plen > d1 {
		count += (plen - d1 + d2 - 1) / d2
	}
	if len(frags) < count {
		return 0, ErrShortBuffer
	}
	for i, off := 0, 0; i < count; i++ {
		h, d := hl, d1
		if i > 0 {
			h, d = hl2, d2
		}
		if cap(frags[i]) < h+min(d, plen-off) {
			return 0, ErrShortBuffer
		}
		off += d
	}
	payload := pkt[hl:tl]
	for i, off := 0, 0; i < count; i++ {
		h, d := hl, d1
		if i > 0 {
			h, d = hl2, d2
		}
		chunk := min(d, plen-off)
		f := frags[i][:h+chunk]
		switch i {
		case 0:
			copy(f, pkt[:hl])
		case 1:
			copy(f, pkt[:IPv4HeaderLen])
			writeCopiedOptions(f[IPv4HeaderLen:hl2], pkt[IPv4HeaderLen:hl])
		default:
			copy(f, frags[1][:hl2])
		}
		copy(f[h:], payload[off:off+chunk])
		f[0] = 0x40 | byte(h/4)
		binary.BigEndian.PutUint16(f[2:4], uint16(h+chunk))
		nf := uint16((origOff+off)>>3) & ipv4OffsetMask
		if off+chunk < plen || ff&IPv4MoreFragments != 0 {
			nf |= IPv4MoreFragments
		}
		binary.BigEndian.PutUint16(f[6:8], nf)
		f[10], f[11] = 0, 0
		binary.BigEndian.PutUint16(f[10:12], Checksum(f[:h], 0))
		frags[i] = f
		off += chunk
	}
	return count, nil
}

// copiedOptionsLen returns the length, padded to 4 bytes, of the options in
// opts that have the copied flag set.
func copiedOptionsLen(opts []byte) (int, error) {
	n := 0
	for i := 0; i < len(opts); {
		t := opts[i]
		if t == 0 { // End of Option List
			break
		}
		if t == 1 { // No Operation
			i++
			continue
		}
		if i+1 >= len(opts) {
			return 0, ErrOptions
		}
		l := int(opts[i+1])
		if l < 2 || i+l > len(opts) {
			return 0, ErrOptions
		}
		if t&0x80 != 0 {
			n += l
		}
		i += l
	}
	return (n + 3) &^ 3, nil
}

// writeCopiedOptions writes the copied options of opts (already validated
// by copiedOptionsLen) into dst, padding with End of Option List.
func writeCopiedOptions(dst, opts []byte) {
	n := 0
	for i := 0; i < len(opts); {
		t := opts[i]
		if t == 0 {
			break
		}
		if t == 1 {
			i++
			continue
		}
		l := int(opts[i+1])
		if t&0x80 != 0 {
			n += copy(dst[n:], opts[i:i+l])
		}
		i += l
	}
	clear(dst[n:])
}

// FragmentIPv6 splits the IPv6 packet pkt, which must have no extension
// headers (a tunnel's outer packet), into fragments of at most mtu bytes with Fragment
// headers of identification id (RFC 8200 section 4.5), written into
// frags. It returns the number of fragments.
func FragmentIPv6(frags [][]byte, pkt []byte, mtu int, id uint32) (int, error) {
	const fh = 8
	if len(pkt) < IPv6HeaderLen || pkt[0]>>4 != 6 {
		return 0, ErrTruncated
	}
	per := (mtu - IPv6HeaderLen - fh) &^ 7
	if per < 8 {
		return 0, ErrFragmentMTU
	}
	payload := pkt[IPv6HeaderLen:]
	k := (len(payload) + per - 1) / per
	if k > len(frags) {
		return 0, ErrShortBuffer
	}
	for i := range k {
		off := i * per
		chunk := payload[off:min(off+per, len(payload))]
		if cap(frags[i]) < IPv6HeaderLen+fh+len(chunk) {
			return 0, ErrShortBuffer
		}
	}
	for i := range k {
		off := i * per
		chunk := payload[off:min(off+per, len(payload))]
		f := frags[i][:IPv6HeaderLen+fh+len(chunk)]
		copy(f, pkt[:IPv6HeaderLen])
		binary.BigEndian.PutUint16(f[4:6], uint16(fh+len(chunk)))
		f[6] = ProtoFragment
		f[40] = pkt[6]
		f[41] = 0
		fo := uint16(off) // offset in 8-byte units << 3 equals the byte offset
		if i < k-1 {
			fo |= 1 // M flag
		}
		binary.BigEndian.PutUint16(f[42:44], fo)
		binary.BigEndian.PutUint32(f[44:48], id)
		copy(f[48:], chunk)
		frags[i] = f
	}
	return k, nil
}
