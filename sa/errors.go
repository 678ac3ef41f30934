package sa

import (
	"errors"
	"fmt"
)

// ErrPolicyExists is returned (wrapped) by AddPolicy for a policy whose
// selector and direction are already installed.
var ErrPolicyExists = errors.New("policy exists")

// ErrNotFound is returned (wrapped) when a state or policy to update or
// delete is not installed.
var ErrNotFound = errors.New("not found")

// ErrStateExists is returned (wrapped) when a state with the same SPI and
// destination is already installed.
var ErrStateExists = errors.New("state already exists")

// ErrNoSPI is returned (wrapped) by AllocSPI when every SPI of the range
// is taken.
var ErrNoSPI = errors.New("no free SPI")

// ErrKeyDirection is the error (wrapped) of a state whose key served the
// other direction before.
var ErrKeyDirection = errors.New("a key serves one direction")

// ErrInvalid is the error (wrapped) of a state, policy or selector that
// Validate refuses: what it asks for cannot be installed as given.
var ErrInvalid = errors.New("invalid")

// ErrImmutable is the error (wrapped) of an UpdateSA that would change what
// a state keeps for its life (keys, algorithms, ESN, reqid, interface ID,
// replay window, origin of its keys); a *FieldError names the field.
var ErrImmutable = errors.New("cannot change on update")

// ErrKeyReuse is the error (wrapped) of a state whose key could send or
// accept a (key, sequence number) twice: a live state holds the key, the
// key served the other direction, a negotiated key is installed by hand, or
// a continuation would number from 1 again without ESN.
var ErrKeyReuse = errors.New("key reuse")

// ErrKeyExhausted is the error (wrapped) of an outbound state whose key
// has used every sequence number its suite can number.
var ErrKeyExhausted = errors.New("key has used every sequence number")

// kindError is err classed as kind: its message is err's, and errors.Is
// and errors.As see both.
type kindError struct{ kind, err error }

func (e *kindError) Error() string   { return e.err.Error() }
func (e *kindError) Unwrap() []error { return []error{e.kind, e.err} }

// classed returns err classed as kind, or nil for a nil err.
func classed(kind, err error) error {
	if err == nil {
		return nil
	}
	return &kindError{kind: kind, err: err}
}

// kindErrorf returns a formatted error classed as kind.
func kindErrorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, err: fmt.Errorf(format, args...)}
}
