//go:build !goexperiment.runtimesecret

package crypto

// SecretErasure reports whether this binary was built with
// GOEXPERIMENT=runtimesecret. It was not: DoSecret only calls f, and stack
// frames, registers and freed heap objects that held keys are left to be
// overwritten by later use.
const SecretErasure = false

// DoSecret runs f. Built with GOEXPERIMENT=runtimesecret it also erases
// the stack, registers and heap objects f used (secret_erasing.go).
func DoSecret(f func()) { f() }
