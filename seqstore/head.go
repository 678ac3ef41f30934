package seqstore

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
)

// The witness, "seq.head", says how long the log is and what it holds,
// so that Open can tell a log shorter than what was acknowledged, or an
// acknowledged record altered, from a record torn by a crash. It holds
// two slots, written alternately (each in its own 512-byte sector, so
// that a torn write spoils one at most) after each record is appended
// and fsynced, and fsynced before the call returns:
//
//	offset  size  field
//	0       8     "espdhead"
//	8       8     generation: the valid slot with the higher one is current
//	16      1     pairs: 1, or 2 while a compaction replaces the log
//	24      8     records in the log, its header included (0: no log)
//	32      32    chain over them (chainNext from zero)
//	64      8     with two pairs: the records of the log that replaces it
//	72      32    and their chain
//	124     4     CRC-32C of bytes 0-123, big endian
//
// The log is acceptable if it starts with one pair's records and chain;
// records beyond them were never acknowledged (a crash between the
// record's fsync and the witness's) and are read only if they are valid
// and last. docs/safety.md says what this protects against.
const (
	headSize     = 128
	headSlot     = 512
	headFileSize = 2 * headSlot
)

// headMagic opens every slot.
var headMagic = []byte("espdhead")

// pair is what a witness acknowledges of one log.
type pair struct {
	count uint64 // records, header included
	chain [32]byte
}

// head is one decoded witness slot.
type head struct {
	gen   uint64
	pairs []pair
}

// chainNext extends the running hash c over one record.
func chainNext(c [32]byte, rec []byte) [32]byte {
	h := sha256.New()
	h.Write(c[:])
	h.Write(rec)
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// putHead encodes h into b.
func putHead(h head, b *[headSize]byte) {
	*b = [headSize]byte{}
	copy(b[:8], headMagic)
	binary.BigEndian.PutUint64(b[8:], h.gen)
	b[16] = byte(len(h.pairs))
	for i, p := range h.pairs {
		binary.BigEndian.PutUint64(b[24+40*i:], p.count)
		copy(b[32+40*i:], p.chain[:])
	}
	binary.BigEndian.PutUint32(b[124:], crc32.Checksum(b[:124], castagnoli))
}

// parseHead decodes a slot; it fails on a torn or damaged one.
func parseHead(b []byte) (head, error) {
	if len(b) < headSize {
		return head{}, errors.New("short slot")
	}
	if crc32.Checksum(b[:124], castagnoli) != binary.BigEndian.Uint32(b[124:]) {
		return head{}, errChecksum
	}
	if !bytes.Equal(b[:8], headMagic) {
		return head{}, errors.New("not a witness slot")
	}
	n := int(b[16])
	if n < 1 || n > 2 {
		return head{}, fmt.Errorf("%d pairs", n)
	}
	h := head{gen: binary.BigEndian.Uint64(b[8:])}
	for i := range n {
		var p pair
		p.count = binary.BigEndian.Uint64(b[24+40*i:])
		copy(p.chain[:], b[32+40*i:])
		h.pairs = append(h.pairs, p)
	}
	return h, nil
}

// readHead returns the current slot of the witness at path: the valid
// slot of the higher generation (the other is the one before it, or a
// write a crash tore). It wraps fs.ErrNotExist if there is none, and
// returns a *CorruptError if neither slot is valid.
func readHead(path string) (head, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return head{}, fmt.Errorf("seqstore: witness: %w", err)
	}
	var best head
	found := false
	var why error
	for i := range 2 {
		if len(b) < i*headSlot+headSize {
			why = fmt.Errorf("%d bytes", len(b))
			continue
		}
		h, err := parseHead(b[i*headSlot : i*headSlot+headSize])
		if err != nil {
			why = err
			continue
		}
		if !found || h.gen > best.gen {
			best, found = h, true
		}
	}
	if !found {
		return head{}, &CorruptError{Path: path, Reason: fmt.Sprintf("witness unreadable (%v): the length and content of the log cannot be checked", why)}
	}
	return best, nil
}

// writeHeadLocked makes pairs the witness's current slot, durably:
// in the slot after the current one, or, if there is no witness yet, in
// a new file renamed into place (so that a witness, once there, always
// has a valid slot). A failure leaves the store unusable (s.err): the
// witness may no longer match the log.
func (s *Store) writeHeadLocked(pairs ...pair) error {
	gen := s.gen + 1
	var b [headSize]byte
	putHead(head{gen: gen, pairs: pairs}, &b)
	if s.head == nil {
		if err := s.createHead(b[:], gen); err != nil {
			return err
		}
		s.gen = gen
		return nil
	}
	if _, err := s.head.WriteAt(b[:], int64(gen%2)*headSlot); err != nil {
		s.err = fmt.Errorf("seqstore: write %s: %w", s.headPath, err)
		return s.err
	}
	if err := s.head.Sync(); err != nil {
		s.err = fmt.Errorf("seqstore: fsync %s: %w", s.headPath, err)
		return s.err
	}
	s.gen = gen
	return nil
}

// createHead writes a new witness with slot b (generation gen) to a
// temporary file, syncs it and renames it into place. A crash before the
// rename leaves no witness (Open removes the temporary file).
func (s *Store) createHead(b []byte, gen uint64) error {
	tmp := filepath.Join(s.dir, headTmpName)
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("seqstore: %w", err)
	}
	buf := make([]byte, headFileSize)
	copy(buf[int64(gen%2)*headSlot:], b)
	_, err = f.Write(buf)
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = os.Rename(tmp, s.headPath)
	}
	if err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("seqstore: create %s: %w", s.headPath, err)
	}
	s.head = f
	if err := syncDir(s.dir); err != nil {
		s.err = fmt.Errorf("seqstore: fsync directory %s: %w", s.dir, err)
		return s.err
	}
	return nil
}

// chainFile returns the chain over the first n records of f.
func chainFile(f *os.File, n uint64) ([32]byte, error) {
	var c [32]byte
	r := io.NewSectionReader(f, 0, int64(n)*recordSize)
	buf := make([]byte, 1<<16)
	for {
		k, err := io.ReadFull(r, buf)
		for i := 0; i+recordSize <= k; i += recordSize {
			c = chainNext(c, buf[i:i+recordSize])
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return c, nil
		}
		if err != nil {
			return c, err
		}
	}
}
