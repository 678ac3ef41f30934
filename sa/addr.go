package sa

import (
	"encoding/binary"
	"net/netip"
)

// Address families as the lookup structures record them; famNone is an
// invalid or zoned address, which no prefix contains.
const (
	famNone uint8 = 0
	fam4    uint8 = 4
	fam6    uint8 = 6
)

// addrBits returns a as a 128-bit number, an IPv4 address in the top 32
// bits, and its family.
func addrBits(a netip.Addr) (hi, lo uint64, fam uint8) {
	if a.Is4() {
		b := a.As4()
		return uint64(binary.BigEndian.Uint32(b[:])) << 32, 0, fam4
	}
	if a.Is6() && a.Zone() == "" {
		b := a.As16()
		return binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:]), fam6
	}
	return 0, 0, famNone
}

// maskBits returns the 128-bit mask of the top bits bits, for addrBits
// numbers.
func maskBits(bits int) (hi, lo uint64) {
	switch {
	case bits <= 0:
		return 0, 0
	case bits < 64:
		return ^uint64(0) << (64 - bits), 0
	case bits < 128:
		return ^uint64(0), ^uint64(0) << (128 - bits)
	}
	return ^uint64(0), ^uint64(0)
}

// prefixFam returns the family and length of a selector prefix; a zero
// prefix is family famNone (any) and length 0.
func prefixFam(p netip.Prefix) (fam uint8, bits int) {
	if !p.IsValid() {
		return famNone, 0
	}
	if p.Addr().Is4() {
		return fam4, p.Bits()
	}
	return fam6, p.Bits()
}

// saKey identifies a state: SPI and outer destination.
type saKey struct {
	spi    uint32
	fam    uint8
	hi, lo uint64
}

func stateKey(spi uint32, dst netip.Addr) saKey {
	hi, lo, fam := addrBits(dst)
	return saKey{spi: spi, fam: fam, hi: hi, lo: lo}
}

func (k saKey) hash(seed uint64) uint64 {
	h := mix64(seed ^ uint64(k.spi)<<8 ^ uint64(k.fam))
	h = mix64(h ^ k.hi)
	return mix64(h ^ k.lo)
}

// polKey is a flow's or a selector's addresses masked to a tuple's prefix
// lengths.
type polKey struct{ sHi, sLo, dHi, dLo uint64 }

func (k polKey) hash(seed uint64) uint64 {
	h := mix64(seed ^ k.sHi)
	h = mix64(h ^ k.sLo)
	h = mix64(h ^ k.dHi)
	return mix64(h ^ k.dLo)
}
