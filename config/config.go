// Package config reads espd's configuration file: the static SAs (XFRM
// states) and policies that manual keying installs at start and re-applies on
// SIGHUP, and the route-based interfaces espd keeps. The format is TOML; see
// docs/config.md for every key.
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
	// Interfaces are the route-based interfaces to keep, in the file's
	// order; no two share a name or an interface ID.
	Interfaces []Interface
}

// Interface is an [[interface]] table: a route-based interface, the
// persistent TUN device espd keeps for one interface ID (XFRM interface
// semantics). The policies with its IfID apply to the packets routed into
// it, and the inbound states with its IfID deliver their decrypted packets
// through it.
type Interface struct {
	// Name is the device's name, valid for Linux (CheckInterfaceName).
	Name string
	// IfID is the interface ID (sa.Config.IfID, sa.Policy.IfID), 1 to
	// 2^32-1: 0 is espd's own policy-based TUN.
	IfID uint32
	// MTU is the device's MTU, 576 to 65535; 0: espd's default.
	MTU int
}

// MinInterfaceMTU and MaxInterfaceMTU bound an [[interface]]'s mtu: 576 is
// the smallest datagram every IPv4 host must take (RFC 791), 65535 the
// largest IP packet.
const (
	MinInterfaceMTU = 576
	MaxInterfaceMTU = 65535
)

// Error is a configuration error with the line it refers to (0 when the
// error is not tied to one line).
type Error struct {
	Path string
	Line int
	Msg  string
	Err  error // the error Msg tells of, if any (Unwrap)
}

// Unwrap returns the underlying error, for errors.Is and errors.As.
func (e *Error) Unwrap() error { return e.Err }

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
		return nil, &Error{Path: path, Msg: err.Error(), Err: err}
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
	ifLines := tableLines(data, "interface")
	f := &File{}
	dir := filepath.Dir(path)
	for i := range doc.SA {
		c, err := doc.SA[i].config(dir)
		if err != nil {
			clear(c.EncKey)
			clear(c.IntegKey)
			f.Wipe()
			return nil, &Error{Path: path, Line: at(saLines, i), Msg: fmt.Sprintf("sa #%d: %v", i+1, err), Err: err}
		}
		f.SAs = append(f.SAs, c)
	}
	for i := range doc.Policy {
		p, err := doc.Policy[i].policy()
		if err != nil {
			f.Wipe()
			return nil, &Error{Path: path, Line: at(polLines, i), Msg: fmt.Sprintf("policy #%d: %v", i+1, err), Err: err}
		}
		f.Policies = append(f.Policies, p)
	}
	for i := range doc.Interface {
		ifc, err := doc.Interface[i].iface()
		if err != nil {
			f.Wipe()
			return nil, &Error{Path: path, Line: at(ifLines, i), Msg: fmt.Sprintf("interface #%d: %v", i+1, err), Err: err}
		}
		f.Interfaces = append(f.Interfaces, ifc)
	}
	if err := f.checkUnique(saLines, polLines, ifLines); err != nil {
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

// checkUnique refuses two SAs with the same SPI and destination, two
// policies with the same selector, direction and interface ID (what
// identifies a policy, sa.PolicyID), and two interfaces with the same name
// or the same interface ID.
func (f *File) checkUnique(saLines, polLines, ifLines []int) *Error {
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
	pseen := map[sa.PolicyID]int{}
	for i, p := range f.Policies {
		k := p.ID()
		if j, dup := pseen[k]; dup {
			what := "same selector and direction"
			if p.IfID != 0 {
				what = fmt.Sprintf("same selector, direction and if_id (%d)", p.IfID)
			}
			return &Error{Line: at(polLines, i), Msg: fmt.Sprintf("policy #%d: %s as policy #%d", i+1, what, j+1)}
		}
		pseen[k] = i
	}
	names := map[string]int{}
	ids := map[uint32]int{}
	for i, ifc := range f.Interfaces {
		if j, dup := names[ifc.Name]; dup {
			return &Error{Line: at(ifLines, i), Msg: fmt.Sprintf("interface #%d: name %q is already interface #%d", i+1, ifc.Name, j+1)}
		}
		if j, dup := ids[ifc.IfID]; dup {
			return &Error{Line: at(ifLines, i), Msg: fmt.Sprintf("interface #%d: if_id %d is already interface #%d (%s)", i+1, ifc.IfID, j+1, f.Interfaces[j].Name)}
		}
		names[ifc.Name], ids[ifc.IfID] = i, i
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
