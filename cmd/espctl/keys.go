package main

import (
	"bytes"
	"fmt"
	"io"

	"github.com/espd/espd/config"
)

// Keys never travel on espctl's command line, where every local user can
// read them (ps, /proc/PID/cmdline): --enc-key-file and --integ-key-file
// name a file holding the key in hex (whitespace, ':' separators and a 0x
// prefix are fine; the file is checked as config.OpenKeyFile says: not a
// link, owned by root or the user running espctl, mode & 0006 == 0), or
// "-" for standard input; a key of zeros only is refused. When both are "-", standard input holds two lines:
// the encryption key, then the integrity key.

// stdinKeys is the name of standard input as a key file.
const stdinKeys = "-"

// refusedKeyFlag is the error for --enc-key, --auth-key and --integ-key.
func refusedKeyFlag(flag, instead string) error {
	return fmt.Errorf("--%s is no longer accepted: a key on the command line is visible to every local user (ps, /proc/PID/cmdline); "+
		"put it in a file only you can read and give --%s PATH, or --%s - to read it from standard input", flag, instead, instead)
}

// readKeys reads the keys named by --enc-key-file and --integ-key-file
// (either may be empty: not given). The keys are the caller's to zero.
func readKeys(encFile, integFile string, stdin io.Reader) (enc, integ []byte, err error) {
	if encFile == stdinKeys && integFile == stdinKeys {
		return readKeyLines(stdin)
	}
	read := func(flag, path string) ([]byte, error) {
		switch path {
		case "":
			return nil, nil
		case stdinKeys:
			return config.ReadKey("--"+flag+" - (standard input)", stdin, -1)
		}
		return config.ReadKeyFile("--"+flag, path, -1)
	}
	if enc, err = read("enc-key-file", encFile); err != nil {
		return nil, nil, err
	}
	if integ, err = read("integ-key-file", integFile); err != nil {
		clear(enc)
		return nil, nil, err
	}
	return enc, integ, nil
}

// readKeyLines reads two keys from standard input: the first non-empty
// line is the encryption key, the second the integrity key.
func readKeyLines(stdin io.Reader) (enc, integ []byte, err error) {
	const what = "--enc-key-file - and --integ-key-file - (standard input)"
	buf, err := config.ReadSecret(what, stdin)
	defer clear(buf)
	if err != nil {
		return nil, nil, err
	}
	var lines [][]byte
	for line := range bytes.Lines(buf) {
		if len(bytes.TrimSpace(line)) > 0 {
			lines = append(lines, line)
		}
	}
	if len(lines) != 2 {
		return nil, nil, fmt.Errorf("%s: want two lines, the encryption key and then the integrity key, in hex; got %d", what, len(lines))
	}
	if enc, err = config.ParseKeyBytes("encryption key (line 1 of standard input)", lines[0], -1); err != nil {
		return nil, nil, err
	}
	if integ, err = config.ParseKeyBytes("integrity key (line 2 of standard input)", lines[1], -1); err != nil {
		clear(enc)
		return nil, nil, err
	}
	return enc, integ, nil
}
