package esp

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/espd/espd/crypto"
)

// fuzzTransforms are the transforms FuzzDecapsulate picks from.
func fuzzTransforms(tb testing.TB) []crypto.Transform {
	return []crypto.Transform{
		newSuite(tb, "aes128gcm16-esn"),
		newSuite(tb, "aes128-sha256"),
		newSuite(tb, "null-sha256"),
		&fakeTransform{iv: 8, bs: 4, icv: 16, key: 1, esn: true},
	}
}

// fuzzSeeds returns seed plaintexts: valid IPv4 and IPv6 trailers, a dummy,
// TFC padding, and broken trailers.
func fuzzSeeds() [][]byte {
	v4 := innerV4(42, 0x02, true)
	v6 := innerV6(58, 0x01)
	tfc := innerV4(42, 0x03, false)
	binary.BigEndian.PutUint16(tfc[2:4], 28)
	return [][]byte{
		trailer(v4, nil, 0, 4),
		trailer(v6, []byte{1, 2, 3, 4, 5, 6, 7, 8}, 8, 41),
		trailer(tfc, []byte{1, 2, 3, 4}, 4, 4),
		trailer(nil, []byte{1, 2}, 2, 59),
		trailer(v4, nil, 0, 41),
		trailer(v6, []byte{1, 2, 9, 4}, 4, 41),
		trailer(v4, nil, 200, 4),
		{},
	}
}

// FuzzDecapsulate feeds Decapsulate two kinds of input: raw bytes as they
// would arrive (mode bit 7 set), and authentic packets sealed around a
// fuzzed plaintext, so that the trailer and inner-packet checks behind the
// ICV are reached. It checks that nothing panics, that every error is one
// of the documented reasons, and that what is accepted is consistent.
func FuzzDecapsulate(f *testing.F) {
	for i, s := range fuzzSeeds() {
		f.Add(uint8(i), uint8(i*0x55), s)
	}
	f.Add(uint8(0x80), uint8(0), []byte{0, 0, 0, 1, 0, 0, 0, 1, 2, 3})
	trs := fuzzTransforms(f)
	known := []error{ErrReplay, ErrPadding, ErrMalformed, ErrDummy, ErrECNDrop, ErrNextHeader, ErrInner, crypto.ErrAuthentication}
	f.Fuzz(func(t *testing.T, mode, tos uint8, data []byte) {
		tr := trs[int(mode)%len(trs)]
		esn := tr.Suite().ESN
		seq := uint64(mode) + 1
		if esn {
			seq += 1 << 32
		}
		d := &Decapsulator{Transform: tr, Replay: NewReplayWindow(64, esn), ECN: mode&0x40 != 0}
		if esn {
			d.Replay.Update(seq - 1)
		}
		var pkt, plain []byte
		if mode&0x80 != 0 {
			pkt = data
		} else {
			bs := tr.BlockSize()
			plain = append([]byte(nil), data...)
			for len(plain) == 0 || len(plain)%bs != 0 {
				plain = append(plain, 0)
			}
			if len(plain) > 4096 {
				return
			}
			pkt = sealRaw(t, tr, seq, plain)
		}
		inner, gotSeq, err := d.Decapsulate(pkt, tos)
		if err != nil {
			ok := false
			for _, k := range known {
				ok = ok || errors.Is(err, k)
			}
			if !ok {
				t.Fatalf("undocumented error %v", err)
			}
			if inner != nil {
				t.Fatalf("inner returned with error %v", err)
			}
		}
		if err == nil {
			l := -1
			switch {
			case len(inner) >= 20 && inner[0]>>4 == 4:
				l = int(binary.BigEndian.Uint16(inner[2:4]))
			case len(inner) >= 40 && inner[0]>>4 == 6:
				l = 40 + int(binary.BigEndian.Uint16(inner[4:6]))
			}
			if l != len(inner) {
				t.Fatalf("accepted an inner packet of %d bytes whose length field says %d", len(inner), l)
			}
		}
		if plain == nil {
			return // raw bytes: only genuine packets (the seeds) open
		}
		if gotSeq != seq {
			t.Fatalf("seq %#x, want %#x", gotSeq, seq)
		}
		nh, pl := plain[len(plain)-1], int(plain[len(plain)-2])
		switch {
		case err == nil:
			if nh != 4 && nh != 41 {
				t.Fatalf("accepted next header %d", nh)
			}
			if nh == 41 && inner[0]>>4 != 6 || nh == 4 && inner[0]>>4 != 4 {
				t.Fatalf("version %d for next header %d", inner[0]>>4, nh)
			}
			l := 40 + int(binary.BigEndian.Uint16(inner[4:6]))
			if nh == 4 {
				l = int(binary.BigEndian.Uint16(inner[2:4]))
			}
			if l != len(inner) || len(inner) > len(plain)-2-pl {
				t.Fatalf("inner %d bytes, length field %d, payload %d", len(inner), l, len(plain)-2-pl)
			}
			same := string(inner[2:]) == string(plain[2:len(inner)])
			if nh == 4 { // the header checksum follows the ECN field
				same = string(inner[2:10]) == string(plain[2:10]) && string(inner[12:]) == string(plain[12:len(inner)])
			}
			ecnBits := byte(0x03) // IPv4 TOS; IPv6 traffic class straddles bytes 0 and 1
			if nh == 41 {
				ecnBits = 0x30
			}
			if !same || inner[0] != plain[0] || inner[1]&^ecnBits != plain[1]&^ecnBits {
				t.Fatal("inner differs from the plaintext beyond the ECN field")
			}
		case errors.Is(err, ErrPadding):
			bad := pl+2 > len(plain)
			for i := 0; !bad && i < pl; i++ {
				bad = plain[len(plain)-2-pl+i] != byte(i+1)
			}
			if !bad {
				t.Fatal("good padding rejected")
			}
		case errors.Is(err, ErrNextHeader):
			if nh == 4 || nh == 41 || nh == 59 {
				t.Fatalf("next header %d rejected", nh)
			}
		case errors.Is(err, ErrDummy):
			if nh != 59 {
				t.Fatalf("dummy with next header %d", nh)
			}
		case errors.Is(err, ErrECNDrop):
			if !d.ECN || tos&3 != 3 {
				t.Fatalf("ECN drop with outer %d", tos&3)
			}
		case errors.Is(err, ErrInner):
		default:
			t.Fatalf("authentic packet rejected: %v", err)
		}
	})
}
