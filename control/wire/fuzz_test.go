package wire

import (
	"bytes"
	"slices"
	"testing"
)

// decodeTyped runs the typed decoder that a message of m's type and flags
// goes through in the server or the client.
func decodeTyped(m *Message) error {
	reply := m.Flags&FlagReply != 0
	var err error
	switch m.Type {
	case MsgHello:
		if reply {
			_, err = ReadHelloReply(m.Attrs)
		} else {
			_, err = ReadHello(m)
		}
	case MsgError:
		_, err = ReadError(m.Attrs)
	case MsgEvent:
		_, err = ReadEvent(m.Attrs)
	case MsgSAAdd:
		_, err = ReadSAAdd(m.Attrs)
	case MsgSAUpdate:
		_, err = ReadSAUpdate(m.Attrs)
	case MsgSAGet, MsgSAList:
		if reply {
			_, err = ReadSAInfo(m.Attrs)
		} else if m.Type == MsgSAGet {
			_, _, err = ReadSAID(m.Attrs)
		}
	case MsgSADel:
		_, _, err = ReadSAID(m.Attrs)
	case MsgSPIAlloc:
		if reply {
			_, err = ReadSPI(m.Attrs)
		} else {
			_, _, err = ReadSPIRange(m.Attrs)
		}
	case MsgPolicyAdd, MsgPolicyUpdate:
		_, err = ReadPolicy(m.Attrs)
	case MsgPolicyDel:
		_, err = ReadPolicyID(m.Attrs)
	case MsgPolicyGet, MsgPolicyList:
		if reply {
			_, err = ReadPolicy(m.Attrs)
		} else {
			_, err = ReadPolicyID(m.Attrs)
		}
	case MsgStats:
		switch {
		case !reply:
			_, _, _, err = ReadStatsRequest(m.Attrs)
		case slices.ContainsFunc(m.Attrs, func(a Attr) bool { return a.Type == AttrGlobalStats }):
			_, err = ReadGlobalStats(m.Attrs) // the first part
		default:
			_, err = ReadSAStats(m.Attrs)
		}
	case MsgSubscribe:
		if !reply {
			_, err = ReadSubscribe(m.Attrs)
		}
	case MsgIKERegister:
		if reply {
			_, _, err = ReadIKEPorts(m.Attrs)
		}
	case MsgIKEPacket:
		_, _, _, err = ReadIKEPacket(m.Attrs)
	case MsgPairRole:
		if reply {
			_, err = ReadPairStatus(m.Attrs)
		} else {
			_, err = ReadPairRole(m.Attrs)
		}
	}
	return err
}

// FuzzDecode feeds arbitrary bytes to Decode and the typed decoders: they
// must not panic, a decoded message must re-encode to the same bytes, and
// a decoded SA_ADD, policy or PAIR_ROLE must survive an encode/decode
// round trip unchanged.
func FuzzDecode(f *testing.F) {
	for _, msg := range sampleMessages(f) {
		f.Add(msg)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Decode(data)
		if err != nil {
			return
		}
		again, err := m.Encode()
		if err != nil {
			t.Fatalf("re-encoding a decoded message: %v", err)
		}
		if !bytes.Equal(again, data) {
			t.Fatalf("re-encoded message differs:\n got % x\nwant % x", again, data)
		}
		if decodeTyped(m) != nil {
			return
		}
		switch m.Type {
		case MsgSAAdd:
			c, _ := ReadSAAdd(m.Attrs)
			b := NewBuilder(Version, MsgSAAdd, 0, 1)
			putSAConfig(b, c, true)
			msg, err := b.Bytes()
			if err != nil {
				t.Fatalf("re-encoding %v: %v", c, err)
			}
			m2, err := Decode(msg)
			if err != nil {
				t.Fatal(err)
			}
			c2, err := ReadSAAdd(m2.Attrs)
			if err != nil || !sameConfig(c, c2) {
				t.Fatalf("SA_ADD round trip: %v\n got %v\nwant %v", err, c2, c)
			}
		case MsgPolicyAdd:
			p, _ := ReadPolicy(m.Attrs)
			b := NewBuilder(Version, MsgPolicyAdd, 0, 1)
			PutPolicy(b, p)
			msg, err := b.Bytes()
			if err != nil {
				t.Fatal(err)
			}
			m2, err := Decode(msg)
			if err != nil {
				t.Fatal(err)
			}
			p2, err := ReadPolicy(m2.Attrs)
			if err != nil || p2 != p {
				t.Fatalf("policy round trip: %v\n got %v\nwant %v", err, p2, p)
			}
		case MsgPairRole:
			if m.Flags&FlagReply == 0 {
				role, _ := ReadPairRole(m.Attrs)
				m2 := decodePair(t, 0, func(b *Builder) { PutPairRole(b, role) })
				if role2, err := ReadPairRole(m2.Attrs); err != nil || role2 != role {
					t.Fatalf("PAIR_ROLE round trip: %v: got %v, want %v", err, role2, role)
				}
				break
			}
			st, _ := ReadPairStatus(m.Attrs)
			m2 := decodePair(t, FlagReply, func(b *Builder) { PutPairStatus(b, st) })
			if st2, err := ReadPairStatus(m2.Attrs); err != nil || st2 != st {
				t.Fatalf("PAIR_ROLE reply round trip: %v\n got %+v\nwant %+v", err, st2, st)
			}
		}
	})
}

// decodePair encodes a PAIR_ROLE message with fill and decodes it.
func decodePair(t *testing.T, flags Flags, fill func(*Builder)) *Message {
	t.Helper()
	b := NewBuilder(Version, MsgPairRole, flags, 1)
	fill(b)
	msg, err := b.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	m, err := Decode(msg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
