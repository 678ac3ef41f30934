package control

import (
	"bytes"
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
			_, err = readHelloReply(m.Attrs)
		} else {
			_, err = readHelloVersions(m)
		}
	case MsgError:
		_, err = readError(m.Attrs)
	case MsgEvent:
		_, err = readEvent(m.Attrs)
	case MsgSAAdd:
		_, err = readSAAdd(m.Attrs)
	case MsgSAUpdate:
		_, err = readSAUpdate(m.Attrs)
	case MsgSAGet, MsgSAList:
		if reply {
			_, err = readSAInfo(m.Attrs)
		} else {
			r := newReader(m.Attrs)
			readSAID(r)
			err = r.error()
		}
	case MsgSADel:
		r := newReader(m.Attrs)
		readSAID(r)
		err = r.error()
	case MsgPolicyAdd, MsgPolicyUpdate:
		_, err = readPolicy(m.Attrs)
	case MsgPolicyDel:
		_, err = readPolicyID(m.Attrs)
	case MsgPolicyGet, MsgPolicyList:
		if reply {
			_, err = readPolicy(m.Attrs)
		} else {
			_, err = readPolicyID(m.Attrs)
		}
	case MsgStats:
		r := newReader(m.Attrs)
		if n, ok := r.nest(AttrGlobalStats, spaceGlobalStats); ok {
			readGlobalStats(n)
			r.absorb(n)
		}
		if n, ok := r.nest(AttrSAStats, spaceSAStats); ok {
			readSAStats(n)
			r.absorb(n)
		}
		err = r.error()
	}
	return err
}

// FuzzDecode feeds arbitrary bytes to Decode and the typed decoders: they
// must not panic, a decoded message must re-encode to the same bytes, and
// a decoded SA_ADD, policy or event must survive an encode/decode round
// trip unchanged.
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
			c, _ := readSAAdd(m.Attrs)
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
			c2, err := readSAAdd(m2.Attrs)
			if err != nil || !sameConfig(c, c2) {
				t.Fatalf("SA_ADD round trip: %v\n got %v\nwant %v", err, c2, c)
			}
		case MsgPolicyAdd:
			p, _ := readPolicy(m.Attrs)
			b := NewBuilder(Version, MsgPolicyAdd, 0, 1)
			putPolicy(b, p)
			msg, err := b.Bytes()
			if err != nil {
				t.Fatal(err)
			}
			m2, err := Decode(msg)
			if err != nil {
				t.Fatal(err)
			}
			p2, err := readPolicy(m2.Attrs)
			if err != nil || p2 != p {
				t.Fatalf("policy round trip: %v\n got %v\nwant %v", err, p2, p)
			}
		}
	})
}
