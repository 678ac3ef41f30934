package daemon

import (
	"sync"

	"github.com/espd/espd/crypto"
)

// aesAccelerated is crypto.AESAccelerated; tests replace it.
var aesAccelerated = crypto.AESAccelerated

// slowSuites remembers the AES suites warnSlowAES has logged.
type slowSuites struct {
	mu     sync.Mutex
	warned map[string]bool
}

// warnSlowAES logs, once per suite, that a state of an AES suite was
// installed on a CPU without AES instructions (crypto.AESAccelerated):
// its AES is slow there, and not constant-time.
func (d *Daemon) warnSlowAES(s crypto.Suite) {
	if !s.UsesAES() || aesAccelerated() {
		return
	}
	s.ESN = false
	name := s.String()
	d.slow.mu.Lock()
	seen := d.slow.warned[name]
	if !seen {
		if d.slow.warned == nil {
			d.slow.warned = map[string]bool{}
		}
		d.slow.warned[name] = true
	}
	d.slow.mu.Unlock()
	if !seen {
		d.log.Warn("this CPU has no AES instructions: AES runs slowly and not in constant time; prefer chacha20poly1305 (docs/deploy.md)",
			"suite", name)
	}
}
