package crypto

import (
	"os"
	"reflect"
	"testing"

	"github.com/espd/espd/crypto/internal/chachapoly"
	"golang.org/x/sys/cpu"
)

// TestChildChaChaSSSE3, in the child run of TestWithoutAESNIAndAVX2 (AVX2
// off), checks that the ChaCha20-Poly1305 transform uses espd's SSSE3
// implementation, so that the child's known-answer and round-trip tests
// of chacha20poly1305 run that code. Outside the child it checks that
// the choice follows chachapoly.Preferred.
func TestChildChaChaSSSE3(t *testing.T) {
	a, err := newChaChaAEAD(make([]byte, 32))
	if err != nil {
		t.Fatal(err)
	}
	mine, err := chachapoly.New(make([]byte, 32))
	if chachapoly.Available && err != nil {
		t.Fatal(err)
	}
	isMine := err == nil && reflect.TypeOf(a) == reflect.TypeOf(mine)
	if isMine != chachapoly.Preferred {
		t.Errorf("newChaChaAEAD returned %T; chachapoly.Preferred is %v", a, chachapoly.Preferred)
	}
	if os.Getenv(noAVX2Env) != "" && cpu.X86.HasSSSE3 && !isMine {
		t.Errorf("with GODEBUG=%s on a CPU with SSSE3, newChaChaAEAD returned %T, not espd's SSSE3 code",
			noAVX2GODEBUG, a)
	}
}
