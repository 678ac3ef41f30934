//go:build goexperiment.runtimesecret

package crypto

import "runtime/secret"

// SecretErasure reports whether this binary was built with
// GOEXPERIMENT=runtimesecret, so that DoSecret erases what it leaves
// behind (on linux/amd64 and linux/arm64; elsewhere runtime/secret only
// calls f).
const SecretErasure = true

// DoSecret runs f, which handles key material, so that nothing of it
// outlives its use: the stack and registers f used are erased when it
// returns, and every heap object it allocated is zeroed when the garbage
// collector frees it (runtime/secret.Do). The data path calls it once per
// batch; keep f free of allocations that outlive it for no reason.
func DoSecret(f func()) { secret.Do(f) }
