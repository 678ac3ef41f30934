package wire

import (
	"encoding/binary"
	"fmt"
	"net/netip"
)

// Attr is one TLV attribute: its type and its value without padding. The
// value of a nested attribute is itself a sequence of attributes.
type Attr struct {
	Type  AttrType
	Value []byte
}

// align4 rounds n up to a multiple of 4.
func align4(n int) int { return (n + 3) &^ 3 }

// ParseAttrs splits b, a sequence of attributes, into its attributes. Every
// attribute must have a Length of at least 4 that fits in b, and zero
// padding up to the next multiple of 4; b must end exactly after the last
// attribute's padding. The values alias b.
func ParseAttrs(b []byte) ([]Attr, error) {
	var attrs []Attr
	off := 0
	for off < len(b) {
		if len(b)-off < AttrHeaderLen {
			return nil, fmt.Errorf("truncated attribute header at offset %d: %d bytes left", off, len(b)-off)
		}
		l := int(binary.BigEndian.Uint16(b[off:]))
		t := AttrType(binary.BigEndian.Uint16(b[off+2:]))
		if l < AttrHeaderLen {
			return nil, fmt.Errorf("attribute %d at offset %d: length %d shorter than its header", t, off, l)
		}
		if l > len(b)-off {
			return nil, fmt.Errorf("attribute %d at offset %d: length %d overruns the %d bytes left", t, off, l, len(b)-off)
		}
		end := off + align4(l)
		if end > len(b) {
			return nil, fmt.Errorf("attribute %d at offset %d: padding to %d overruns the %d bytes left", t, off, align4(l), len(b)-off)
		}
		for _, p := range b[off+l : end] {
			if p != 0 {
				return nil, fmt.Errorf("attribute %d at offset %d: non-zero padding", t, off)
			}
		}
		attrs = append(attrs, Attr{Type: t, Value: b[off+AttrHeaderLen : off+l : off+l]})
		off = end
	}
	return attrs, nil
}

// Builder appends attributes to a message. The zero value is not usable;
// get one from NewBuilder. Values too large for an attribute's 16-bit length
// make Bytes fail.
type Builder struct {
	buf   []byte
	nests []int
	err   error
}

// NewBuilder starts a message with the header fields given. The Length
// field is filled in by Bytes.
func NewBuilder(version uint8, t MsgType, flags Flags, seq uint32) *Builder {
	b := &Builder{buf: make([]byte, HeaderLen, 256)}
	binary.BigEndian.PutUint16(b.buf[0:], Magic)
	b.buf[2] = version
	b.buf[3] = uint8(flags)
	binary.BigEndian.PutUint16(b.buf[4:], uint16(t))
	binary.BigEndian.PutUint32(b.buf[12:], seq)
	return b
}

func (b *Builder) attr(t AttrType, n int) []byte {
	l := AttrHeaderLen + n
	if l > 0xFFFF && b.err == nil {
		b.err = fmt.Errorf("attribute %d: %d bytes do not fit in an attribute", t, n)
	}
	start := len(b.buf)
	b.buf = append(b.buf, make([]byte, align4(l))...)
	binary.BigEndian.PutUint16(b.buf[start:], uint16(l))
	binary.BigEndian.PutUint16(b.buf[start+2:], uint16(t))
	return b.buf[start+AttrHeaderLen : start+l]
}

// U32 appends a 32-bit unsigned attribute.
func (b *Builder) U32(t AttrType, v uint32) {
	binary.BigEndian.PutUint32(b.attr(t, 4), v)
}

// U64 appends a 64-bit unsigned attribute.
func (b *Builder) U64(t AttrType, v uint64) {
	binary.BigEndian.PutUint64(b.attr(t, 8), v)
}

// Bool appends a boolean as a u32 0 or 1.
func (b *Builder) Bool(t AttrType, v bool) {
	var u uint32
	if v {
		u = 1
	}
	b.U32(t, u)
}

// U16Pair appends two 16-bit values in one 4-byte attribute (port ranges,
// port pairs).
func (b *Builder) U16Pair(t AttrType, x, y uint16) {
	v := b.attr(t, 4)
	binary.BigEndian.PutUint16(v, x)
	binary.BigEndian.PutUint16(v[2:], y)
}

// Raw appends an attribute with the bytes given as value.
func (b *Builder) Raw(t AttrType, v []byte) {
	copy(b.attr(t, len(v)), v)
}

// String appends a string attribute (no terminating NUL).
func (b *Builder) String(t AttrType, s string) {
	copy(b.attr(t, len(s)), s)
}

// Addr appends an address attribute: 4 bytes for IPv4, 16 for IPv6. An
// invalid address is not appended.
func (b *Builder) Addr(t AttrType, a netip.Addr) {
	if !a.IsValid() {
		return
	}
	a = a.Unmap()
	if a.Is4() {
		v := a.As4()
		b.Raw(t, v[:])
		return
	}
	v := a.As16()
	b.Raw(t, v[:])
}

// Prefix appends a prefix attribute: the prefix length, three zero bytes and
// the address (4 or 16 bytes). An invalid prefix is not appended.
func (b *Builder) Prefix(t AttrType, p netip.Prefix) {
	if !p.IsValid() {
		return
	}
	a := p.Addr()
	bits := p.Bits()
	if a.Is4In6() {
		a = a.Unmap()
		bits -= 96
	}
	if a.Is4() {
		v := b.attr(t, 8)
		v[0] = uint8(bits)
		x := a.As4()
		copy(v[4:], x[:])
		return
	}
	v := b.attr(t, 20)
	v[0] = uint8(bits)
	x := a.As16()
	copy(v[4:], x[:])
}

// Nest starts a nested attribute; the attributes appended until the
// matching End form its value.
func (b *Builder) Nest(t AttrType) {
	b.nests = append(b.nests, len(b.buf))
	b.attr(t, 0)
}

// End closes the innermost Nest.
func (b *Builder) End() {
	if len(b.nests) == 0 {
		if b.err == nil {
			b.err = fmt.Errorf("End without Nest")
		}
		return
	}
	start := b.nests[len(b.nests)-1]
	b.nests = b.nests[:len(b.nests)-1]
	l := len(b.buf) - start
	if l > 0xFFFF && b.err == nil {
		b.err = fmt.Errorf("nested attribute %d: %d bytes do not fit in an attribute", binary.BigEndian.Uint16(b.buf[start+2:]), l)
	}
	binary.BigEndian.PutUint16(b.buf[start:], uint16(l))
}

// Clear zeroes the bytes built so far, whether or not Bytes succeeded: a
// message may hold keys. What Bytes returned is cleared with them.
func (b *Builder) Clear() { clear(b.buf) }

// Bytes fills in the Length field and returns the encoded message. It fails
// when a Nest was left open, an attribute overflowed or the message is
// larger than MaxMessageSize.
func (b *Builder) Bytes() ([]byte, error) {
	if b.err != nil {
		return nil, b.err
	}
	if len(b.nests) != 0 {
		return nil, fmt.Errorf("%d nested attributes left open", len(b.nests))
	}
	if len(b.buf) > MaxMessageSize {
		return nil, Errorf(EMSGSIZE, "message of %d bytes exceeds the maximum of %d", len(b.buf), MaxMessageSize)
	}
	binary.BigEndian.PutUint32(b.buf[8:], uint32(len(b.buf)))
	return b.buf, nil
}
