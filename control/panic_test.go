package control

import (
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/sa"
)

// panickyBackend panics in AddSA; everything else is dbBackend's.
type panickyBackend struct{ dbBackend }

func (panickyBackend) AddSA(sa.Config) error { panic("backend bug") }

// TestHandlerPanic: a panic while handling a message answers EIO, logs
// the panic with its stack, closes that connection only, and the server
// goes on serving others.
func TestHandlerPanic(t *testing.T) {
	db := sa.NewDB(sa.Options{AcquireInterval: -1})
	var mu sync.Mutex
	var logged []string
	path := t.TempDir() + "/espd.sock"
	serveT(t, panickyBackend{dbBackend{db}}, ServerConfig{Path: path, Logf: func(f string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, f)
		t.Logf(f, a...)
	}})
	other := dial(t, path)

	rc := rawDial(t, path)
	rc.send(encode(t, wire.MsgSAAdd, 0, 7, func(b *wire.Builder) {
		b.U32(wire.AttrSPI, 0x1000)
		b.Addr(wire.AttrSrc, netip.MustParseAddr("198.18.0.1"))
		b.Addr(wire.AttrDst, netip.MustParseAddr("198.18.0.2"))
		b.U32(wire.AttrDir, 2)
		b.String(wire.AttrAlgName, "aes128gcm16")
		b.Raw(wire.AttrEncKey, make([]byte, 20))
	}))
	e := rc.wantError(7, wire.EIO)
	if !strings.Contains(e.Msg, "internal error") {
		t.Errorf("error message %q", e.Msg)
	}
	rc.wantEOF()
	if _, err := other.Stats(testCtx(t)); err != nil {
		t.Fatalf("another client after the panic: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(logged) == 0 || !strings.Contains(logged[len(logged)-1], "internal error") {
		t.Errorf("the panic was not logged: %q", logged)
	}
}
