package config

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
)

// MaxKeyFile is the largest key file ReadKeyFile and ReadKey accept: far
// more than any key in hex, with room for comments-free whitespace.
const MaxKeyFile = 64 << 10

// ParseKeyBytes parses hex key material held in b: an optional 0x prefix,
// then hex digits, with whitespace (spaces, tabs, line breaks) and ':'
// separators anywhere; want is the key length the suite needs (0: no key
// may be given; negative: any length but 0). A key of zeros only is
// refused. b is not changed; the scratch copies it makes are zeroed
// before it returns. Errors never repeat key material.
func ParseKeyBytes(name string, b []byte, want int) ([]byte, error) {
	digits := make([]byte, 0, len(b))
	defer func() { clear(digits[:cap(digits)]) }()
	i := 0
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	if i+1 < len(b) && b[i] == '0' && (b[i+1] == 'x' || b[i+1] == 'X') {
		i += 2
	}
	for ; i < len(b); i++ {
		if ch := b[i]; !isSpace(ch) && ch != ':' {
			digits = append(digits, ch)
		}
	}
	if want == 0 {
		if len(digits) != 0 {
			return nil, fmt.Errorf("%s given, but the suite takes none", name)
		}
		return nil, nil
	}
	if len(digits) == 0 {
		if want < 0 {
			return nil, fmt.Errorf("%s is empty: want the key in hex", name)
		}
		return nil, fmt.Errorf("%s is required: %d bytes in hex", name, want)
	}
	if len(digits)%2 != 0 {
		return nil, fmt.Errorf("%s has an odd number of hex digits (%d)", name, len(digits))
	}
	k := make([]byte, len(digits)/2)
	if _, err := hex.Decode(k, digits); err != nil {
		clear(k)
		// hex.InvalidByteError would quote a character of the key.
		return nil, fmt.Errorf("%s is not valid hex", name)
	}
	if want > 0 && len(k) != want {
		n := len(k)
		clear(k)
		return nil, fmt.Errorf("%s is %d bytes; the suite needs %d", name, n, want)
	}
	var or byte
	for _, c := range k {
		or |= c
	}
	if or == 0 {
		return nil, fmt.Errorf("%s is all zeros: not a secret; generate one (head -c %d /dev/urandom | od -An -tx1)", name, len(k))
	}
	return k, nil
}

func isSpace(ch byte) bool { return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\n' }

// ReadKeyFile reads hex key material (as ParseKeyBytes parses it) from the
// file at path, opened once by OpenKeyFile, which checks it. Its errors
// start with name and path. The bytes read are zeroed before it returns;
// the caller zeroes the key once it is used.
func ReadKeyFile(name, path string, want int) ([]byte, error) {
	f, err := OpenKeyFile(name, path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadKey(name+" "+path, f, want)
}

// ReadKey reads hex key material from r until EOF (at most MaxKeyFile
// bytes) and parses it as ParseKeyBytes does. The buffer it reads into is
// zeroed before it returns.
func ReadKey(name string, r io.Reader, want int) ([]byte, error) {
	buf, err := ReadSecret(name, r)
	defer clear(buf)
	if err != nil {
		return nil, err
	}
	return ParseKeyBytes(name, buf, want)
}

// ReadSecret reads r until EOF into one buffer of MaxKeyFile+1 bytes,
// allocated once (so that no grown copy of a key is left behind), and
// returns what was read. The caller zeroes it.
func ReadSecret(name string, r io.Reader) ([]byte, error) {
	buf := make([]byte, MaxKeyFile+1)
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			clear(buf)
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	if n > MaxKeyFile {
		clear(buf)
		return nil, fmt.Errorf("%s: more than %d bytes: not a key file", name, MaxKeyFile)
	}
	return buf[:n], nil
}
