//go:build !(goexperiment.runtimesecret && linux && (amd64 || arm64))

package crypto

// SecretErasure reports whether DoSecret erases what it leaves behind. It
// does not: this binary was built without GOEXPERIMENT=runtimesecret, or
// for a platform other than linux/amd64 and linux/arm64, where
// runtime/secret erases nothing. Stack frames, registers and freed heap
// objects that held keys are left to be overwritten by later use.
const SecretErasure = false

// DoSecret runs f. Built with GOEXPERIMENT=runtimesecret for linux/amd64
// or linux/arm64 it also erases the stack, registers and heap objects f
// used (secret_erasing.go).
func DoSecret(f func()) { f() }
