//go:build !amd64 || !gc || purego

package chachapoly

import (
	"crypto/cipher"
	"errors"
)

// Available and Preferred are false: this architecture or build has no
// implementation here, and golang.org/x/crypto's is the one to use.
const (
	Available = false
	Preferred = false
)

// New fails: there is no implementation in this architecture or build.
func New(key []byte) (cipher.AEAD, error) {
	return nil, errors.New("chachapoly: no SSSE3 implementation in this build")
}
