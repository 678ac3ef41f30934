// Package statefile writes and reads the small records espd keeps in its
// state directory (the hold file, the record of route-based interfaces)
// so that a power loss, a full disk or a stray edit can never make one
// read as something it is not.
//
// Replace is the atomic write every record uses: the data goes to a file
// beside the record, is fsynced, renamed over the record, and the
// directory is fsynced, so that after a crash the record is the old one or
// the new one, never a mix. Write adds a trailer that counts the body's
// bytes and carries their CRC-32C checksum; Read refuses a file whose
// trailer is missing or disagrees (ErrDamaged), and an empty file, which
// is a record cut short, not an empty record: only a missing file is "no
// record" (Read's found is false).
package statefile

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrDamaged is what a record that cannot be trusted wraps.
var ErrDamaged = errors.New("state file damaged")

// trailerTag starts the last line Write adds: "espd-end LEN CRC32C".
const trailerTag = "espd-end "

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Seal returns body followed by its trailer. A body that does not end in
// a newline gets one first.
func Seal(body []byte) []byte {
	out := make([]byte, 0, len(body)+32)
	out = append(out, body...)
	if len(out) > 0 && out[len(out)-1] != '\n' {
		out = append(out, '\n')
	}
	n := len(out)
	return fmt.Appendf(out, "%s%d %08x\n", trailerTag, n, crc32.Checksum(out[:n], castagnoli))
}

// Open returns the body of data that Seal made, or an error wrapping
// ErrDamaged saying what is wrong: empty, no trailer (cut short), a
// length or checksum that disagrees, text after the trailer.
func Open(data []byte) ([]byte, error) {
	if len(data) == 0 {
		return nil, fmt.Errorf("%w: empty (a record cut short; only a missing file means none)", ErrDamaged)
	}
	if data[len(data)-1] != '\n' {
		return nil, fmt.Errorf("%w: no trailer (cut short)", ErrDamaged)
	}
	i := bytes.LastIndexByte(data[:len(data)-1], '\n') + 1
	last := string(data[i : len(data)-1])
	if !strings.HasPrefix(last, trailerTag) {
		return nil, fmt.Errorf("%w: no trailer (cut short, or not written by this espd)", ErrDamaged)
	}
	f := strings.Fields(strings.TrimPrefix(last, trailerTag))
	if len(f) != 2 {
		return nil, fmt.Errorf("%w: trailer %q", ErrDamaged, last)
	}
	n, err1 := strconv.Atoi(f[0])
	sum, err2 := strconv.ParseUint(f[1], 16, 32)
	switch {
	case err1 != nil || err2 != nil:
		return nil, fmt.Errorf("%w: trailer %q", ErrDamaged, last)
	case n != i:
		return nil, fmt.Errorf("%w: the trailer counts %d bytes before it, the file has %d", ErrDamaged, n, i)
	case uint32(sum) != crc32.Checksum(data[:i], castagnoli):
		return nil, fmt.Errorf("%w: checksum mismatch", ErrDamaged)
	}
	return data[:i], nil
}

// Read returns the body of the record at path. A missing file is no
// record (found false, nil error); a damaged one is an error wrapping
// ErrDamaged that names path.
func Read(path string) (body []byte, found bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	body, err = Open(data)
	if err != nil {
		return nil, true, fmt.Errorf("%s: %w", path, err)
	}
	return body, true, nil
}

// Write replaces the record at path with body and its trailer (Seal),
// atomically and durably (Replace).
func Write(path string, body []byte) error { return Replace(path, Seal(body)) }

// Replace replaces path with data, mode 0600: written to path+".new"
// (which must not be a symbolic link), fsynced, renamed over path, and the
// directory fsynced. On error path is unchanged and the error names it.
func Replace(path string, data []byte) error {
	tmp := path + ".new"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return fmt.Errorf("write %s: open its directory: %w", path, err)
	}
	err = d.Sync()
	d.Close()
	if err != nil {
		return fmt.Errorf("write %s: sync its directory: %w", path, err)
	}
	return nil
}
