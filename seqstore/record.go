package seqstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/espd/espd/crypto"
)

// The log is a sequence of fixed-size records: a header, then one record
// per change, appended and synced before the call that made it returns.
//
//	offset  size  field
//	0       1     kind: 1 header, 2 reserved (in use), 3 retired,
//	              4 clock (written at Close: how long espd ran)
//	1       1     flags: bit 0 reused (written by earlier versions: the
//	              key was added again after use), bit 1 negotiated
//	              (every state of the key was negotiated by IKE), bit 2
//	              inbound (format 2: the key is used by inbound states;
//	              value is then 0)
//	2       6     zero
//	8       8     value: the highest sequence number that may have been
//	              sent with the key (header: the format version)
//	16      8     run clock in seconds (retention ages by it)
//	24      32    key fingerprint (header: the magic string)
//	56      4     zero
//	60      4     CRC-32C of bytes 0-59, big endian
//
// A record never straddles a 512-byte sector, so a crash while one is
// written leaves it either whole, absent or as a bad record at the very
// end of the file.
const recordSize = 64

// Record kinds.
const (
	kindHeader  = 1
	kindReserve = 2
	kindRetire  = 3
	kindClock   = 4
)

// Record flags.
const (
	// flagReused was set by earlier versions on a key that was resumed
	// with sequence numbers already used, to keep its record for ever.
	// Their records never have flagNegotiated, so they are kept for ever
	// anyway; this version reads the bit, keeps it on the records that
	// have it and never sets it.
	flagReused = 1
	// flagNegotiated marks a key whose every state was negotiated by an
	// IKE daemon (sa.Config.Negotiated): it is never installed again once
	// retired, so its record may expire after Options.Retain. A record
	// without it is a manual key's (or was written before the origin was
	// recorded) and is kept for ever.
	flagNegotiated = 2
	// flagInbound marks the record of a key used by inbound states: it
	// has no sequence numbers of espd's, and it must never be used
	// outbound (nor an outbound key inbound): a key serves one
	// direction, for ever.
	flagInbound = 4
)

// formatVersion is the header's value. Version 2 added flagInbound and
// the witness (head.go); an espd that reads only version 1 refuses a
// version 2 log (fail closed). Version 1 logs are read, and upgraded by
// the compaction at Open.
const (
	formatVersion = 2
	formatV1      = 1
)

// magic is the header's fingerprint field.
var magic = crypto.Fingerprint([]byte("espd outbound sequence numbers\n\x00"))

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// record is one decoded record.
type record struct {
	kind  uint8
	flags uint8
	value uint64
	clock uint64
	fp    crypto.Fingerprint
}

// put encodes r into b.
func (r *record) put(b *[recordSize]byte) {
	*b = [recordSize]byte{}
	b[0], b[1] = r.kind, r.flags
	binary.BigEndian.PutUint64(b[8:], r.value)
	binary.BigEndian.PutUint64(b[16:], r.clock)
	copy(b[24:56], r.fp[:])
	binary.BigEndian.PutUint32(b[60:], crc32.Checksum(b[:60], castagnoli))
}

// errChecksum is a record whose checksum does not match: torn or damaged.
var errChecksum = errors.New("bad checksum")

// parse decodes one record; it checks the checksum and the fields a valid
// record must have.
func parse(b []byte) (record, error) {
	if len(b) < recordSize {
		return record{}, fmt.Errorf("short record (%d of %d bytes)", len(b), recordSize)
	}
	if crc32.Checksum(b[:60], castagnoli) != binary.BigEndian.Uint32(b[60:64]) {
		return record{}, errChecksum
	}
	r := record{kind: b[0], flags: b[1], value: binary.BigEndian.Uint64(b[8:]), clock: binary.BigEndian.Uint64(b[16:])}
	copy(r.fp[:], b[24:56])
	if r.flags&flagInbound != 0 && r.value != 0 {
		return record{}, errors.New("inbound record with a sequence number")
	}
	for _, z := range [][]byte{b[2:8], b[56:60]} {
		for _, c := range z {
			if c != 0 {
				return record{}, errors.New("non-zero reserved bytes")
			}
		}
	}
	if r.flags&^(flagReused|flagNegotiated|flagInbound) != 0 {
		return record{}, fmt.Errorf("unknown flags %#x", r.flags)
	}
	if r.kind < kindHeader || r.kind > kindClock {
		return record{}, fmt.Errorf("unknown record kind %d", r.kind)
	}
	return r, nil
}
