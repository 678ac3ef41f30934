package crypto

import (
	"runtime"
	"sync"
	"time"
)

// Key material leaves espd's memory in two ways.
//
// What the transforms own and can reach (salts, the HMAC and IV
// generation keys) is wiped in place by Zero.
//
// Everything else, the key schedules inside crypto/aes, crypto/cipher,
// crypto/hmac and x/crypto, the pooled CBC modes and HMAC states, the
// temporaries of parsing a key and the stack frames and registers of
// every Seal and Open, is erased by the Go runtime itself (runtime/secret,
// GOEXPERIMENT=runtimesecret, linux/amd64 and linux/arm64): code that
// handles keys runs under DoSecret, which erases the stack and registers
// it used when it returns and marks every heap object it allocates, so
// that the garbage collector zeroes the object when it frees it. Zero
// drops the transform's last references to those objects and asks for a
// collection (requestErase), so a deleted SA's key schedules are gone
// within eraseInterval rather than whenever the heap happens to be
// reused.
//
// A binary built without the experiment still wipes what Zero reaches,
// but SecretErasure is false: the daemon says so in its log at start, and
// docs/safety.md says what is then left behind.

// eraseInterval bounds how often a deleted transform triggers a garbage
// collection: deletions that arrive together (a flush, a rekey storm)
// share one.
const eraseInterval = 100 * time.Millisecond

// eraser runs the collections that erase freed secret objects.
var eraser struct {
	once sync.Once
	wake chan struct{}
}

// requestErase asks for a garbage collection soon, so that the objects a
// zeroed transform dropped are freed, and so erased, promptly. It never
// blocks: Zero runs on the data path when the last batch releases a dead
// state.
func requestErase() {
	if !SecretErasure {
		return
	}
	eraser.once.Do(startEraser)
	select {
	case eraser.wake <- struct{}{}:
	default: // one is pending already; it covers this request
	}
}

func startEraser() {
	eraser.wake = make(chan struct{}, 1)
	go eraseLoop()
}

func eraseLoop() {
	for range eraser.wake {
		// runtime.GC returns after the sweep: every secret object found
		// unreachable has been zeroed.
		runtime.GC()
		time.Sleep(eraseInterval)
	}
}
