//go:build goexperiment.runtimesecret && linux && (amd64 || arm64)

package crypto

import "runtime/secret"

// SecretErasure reports whether DoSecret erases what it leaves behind:
// this binary was built with GOEXPERIMENT=runtimesecret for linux/amd64
// or linux/arm64, the platforms where runtime/secret erases (elsewhere it
// only calls f, and secret_plain.go applies).
const SecretErasure = true

// DoSecret runs f, which handles key material, so that nothing of it
// outlives its use: the stack and registers f used are erased when it
// returns, and every heap object it allocated is zeroed when the garbage
// collector frees it (runtime/secret.Do). The data path calls it once per
// batch; keep f free of allocations that outlive it for no reason.
func DoSecret(f func()) { secret.Do(f) }
