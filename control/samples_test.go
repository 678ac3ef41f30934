package control

import (
	"slices"
	"testing"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/control/wire/wiretest"
)

// The shared samples (control/wire/wiretest), under the names the tests use.
var (
	v4a, v4b, v6a, v6b = wiretest.V4A, wiretest.V4B, wiretest.V6A, wiretest.V6B

	mustSuite    = wiretest.MustSuite
	key          = wiretest.Key
	fullConfig   = wiretest.FullConfig
	gcmConfig    = wiretest.GCMConfig
	oseqConfig   = wiretest.OSeqConfig
	replayConfig = wiretest.ReplayConfig
	fullPolicy   = wiretest.FullPolicy
	sameConfig   = wiretest.SameConfig
)

// decodeOK decodes msg, which must be valid.
func decodeOK(t *testing.T, msg []byte) *wire.Message {
	t.Helper()
	m, err := wire.Decode(msg)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	return m
}

// encode builds a message with fill.
func encode(t testing.TB, typ wire.MsgType, flags wire.Flags, seq uint32, fill func(*wire.Builder)) []byte {
	t.Helper()
	b := wire.NewBuilder(wire.Version, typ, flags, seq)
	if fill != nil {
		fill(b)
	}
	msg, err := b.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	return slices.Clone(msg)
}
