// Package config reads espd's configuration file: the static SAs (XFRM
// states) and policies that manual keying installs at start and re-applies on
// SIGHUP. The format is TOML; see docs/config.md for every key.
//
// Parse validates everything it can without touching the running daemon, so
// that an invalid file is refused as a whole, with the line and the reason,
// and the running state is left alone.
package config

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/BurntSushi/toml"

	"github.com/espd/espd/sa"
)

// File is a parsed and validated configuration file.
type File struct {
	// SAs are the states to install, keys included.
	SAs []sa.Config
	// Policies are the policies to install.
	Policies []sa.Policy
}

// Error is a configuration error with the line it refers to (0 when the
// error is not tied to one line).
type Error struct {
	Path string
	Line int
	Msg  string
}

// Error implements error.
func (e *Error) Error() string {
	switch {
	case e.Path != "" && e.Line > 0:
		return fmt.Sprintf("%s:%d: %s", e.Path, e.Line, e.Msg)
	case e.Line > 0:
		return fmt.Sprintf("line %d: %s", e.Line, e.Msg)
	case e.Path != "":
		return fmt.Sprintf("%s: %s", e.Path, e.Msg)
	}
	return e.Msg
}

// Parse decodes and validates a configuration file. path names the file
// in error messages, and its directory is where relative key file names
// (enc_key_file, integ_key_file) start. The keys in the File are the
// caller's to zero once installed (Wipe).
func Parse(path string, data []byte) (*File, error) {
	var doc document
	md, err := toml.Decode(string(data), &doc)
	if err != nil {
		var pe toml.ParseError
		if errors.As(err, &pe) {
			msg := pe.Message
			if pe.LastKey != "" {
				msg = fmt.Sprintf("%s: %s", pe.LastKey, pe.Message)
			}
			return nil, &Error{Path: path, Line: pe.Position.Line, Msg: msg}
		}
		return nil, &Error{Path: path, Msg: err.Error()}
	}
	if und := md.Undecoded(); len(und) > 0 {
		keys := make([]string, len(und))
		for i, k := range und {
			keys[i] = k.String()
		}
		return nil, &Error{Path: path, Line: lineOfKey(data, und[0]), Msg: "unknown key " + strings.Join(keys, ", ")}
	}
	saLines := tableLines(data, "sa")
	polLines := tableLines(data, "policy")
	f := &File{}
	dir := filepath.Dir(path)
	for i := range doc.SA {
		c, err := doc.SA[i].config(dir)
		if err != nil {
			clear(c.EncKey)
			clear(c.IntegKey)
			f.Wipe()
			return nil, &Error{Path: path, Line: at(saLines, i), Msg: fmt.Sprintf("sa #%d: %v", i+1, err)}
		}
		f.SAs = append(f.SAs, c)
	}
	for i := range doc.Policy {
		p, err := doc.Policy[i].policy()
		if err != nil {
			f.Wipe()
			return nil, &Error{Path: path, Line: at(polLines, i), Msg: fmt.Sprintf("policy #%d: %v", i+1, err)}
		}
		f.Policies = append(f.Policies, p)
	}
	if err := f.checkUnique(saLines, polLines); err != nil {
		f.Wipe()
		err.Path = path
		return nil, err
	}
	return f, nil
}

// Wipe zeroes the keys f holds; call it once they are installed (the SA
// database builds its transforms from them and keeps no copy).
func (f *File) Wipe() {
	for i := range f.SAs {
		clear(f.SAs[i].EncKey)
		clear(f.SAs[i].IntegKey)
	}
}

// checkUnique refuses two SAs with the same SPI and destination, and two
// policies with the same selector and direction.
func (f *File) checkUnique(saLines, polLines []int) *Error {
	type saKey struct {
		spi uint32
		dst string
	}
	seen := map[saKey]int{}
	for i, c := range f.SAs {
		k := saKey{c.SPI, c.Dst.String()}
		if j, dup := seen[k]; dup {
			return &Error{Line: at(saLines, i), Msg: fmt.Sprintf("sa #%d: SPI 0x%08x to %s is already sa #%d", i+1, c.SPI, c.Dst, j+1)}
		}
		seen[k] = i
	}
	type polKey struct {
		sel sa.Selector
		dir sa.Direction
	}
	pseen := map[polKey]int{}
	for i, p := range f.Policies {
		k := polKey{p.Selector, p.Dir}
		if j, dup := pseen[k]; dup {
			return &Error{Line: at(polLines, i), Msg: fmt.Sprintf("policy #%d: same selector and direction as policy #%d", i+1, j+1)}
		}
		pseen[k] = i
	}
	return nil
}

// at returns lines[i], or 0 when the table's line is unknown.
func at(lines []int, i int) int {
	if i < len(lines) {
		return lines[i]
	}
	return 0
}

// tableLines returns the 1-based line numbers of the [[name]] array-of-tables
// headers, in order; the n-th entry is the n-th element of the array.
func tableLines(data []byte, name string) []int {
	var lines []int
	for i, l := range strings.Split(string(data), "\n") {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "[[") {
			continue
		}
		end := strings.Index(l, "]]")
		if end < 0 {
			continue
		}
		if strings.TrimSpace(l[2:end]) == name {
			lines = append(lines, i+1)
		}
	}
	return lines
}

// lineOfKey finds the first line that assigns the last element of key.
func lineOfKey(data []byte, key toml.Key) int {
	if len(key) == 0 {
		return 0
	}
	last := key[len(key)-1]
	for i, l := range strings.Split(string(data), "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, last) && strings.HasPrefix(strings.TrimSpace(l[len(last):]), "=") {
			return i + 1
		}
	}
	return 0
}
