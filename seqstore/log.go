package seqstore

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// load reads the log into entries and checks it against its witness.
func (s *Store) load() error {
	for _, n := range []string{tmpName, headTmpName} {
		if err := removeIfExists(filepath.Join(s.dir, n)); err != nil {
			return fmt.Errorf("seqstore: remove unfinished compaction: %w", err)
		}
	}
	h, herr := readHead(s.headPath)
	noHead := errors.Is(herr, fs.ErrNotExist)
	if herr != nil && !noHead {
		return herr
	}
	f, err := os.Open(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		if noHead || h.acks(0) {
			return nil // never used, or a crash before the first log
		}
		return &CorruptError{Path: s.path, Reason: fmt.Sprintf("the log is missing, but its witness %s acknowledges %d records", s.headPath, h.pairs[0].count)}
	}
	if err != nil {
		return fmt.Errorf("seqstore: %w", err)
	}
	defer f.Close()
	corrupt := func(off int64, format string, args ...any) error {
		return &CorruptError{Path: s.path, Offset: off, Reason: fmt.Sprintf(format, args...)}
	}
	// acked is what the witness acknowledges at most: a bad record below
	// it, in a log that matches no pair, was acknowledged, so it is
	// damage, never a torn write.
	var acked uint64
	for _, p := range h.pairs {
		acked = max(acked, p.count)
	}
	chains := make(map[uint64][32]byte, 2) // the chain after each pair's count
	r := bufio.NewReaderSize(f, 1<<16)
	var buf [recordSize]byte
	var chain [32]byte
	var n uint64 // whole records read
	var off int64
	version := uint64(0)
	bad, badOff, badReason := false, int64(0), ""
	for ; ; off += recordSize {
		if h.acks(n) {
			chains[n] = chain
		}
		k, err := io.ReadFull(r, buf[:])
		if err == io.EOF {
			break
		}
		if err != nil && err != io.ErrUnexpectedEOF {
			return fmt.Errorf("seqstore: read %s: %w", s.path, err)
		}
		rec, perr := parse(buf[:k])
		if k == recordSize {
			chain = chainNext(chain, buf[:])
			n++
		}
		if off == 0 {
			// The header is written by a compaction and synced before
			// the rename that makes the file visible: it is never torn.
			switch {
			case perr != nil:
				return corrupt(0, "header: %v", perr)
			case rec.kind != kindHeader || rec.fp != magic:
				return corrupt(0, "not a sequence-number store")
			case rec.value != formatVersion && rec.value != formatV1:
				return corrupt(0, "format version %d, this espd reads %d and %d", rec.value, formatV1, formatVersion)
			}
			version = rec.value
			s.clockBase = max(s.clockBase, rec.clock)
			s.count, s.chain = 1, chain
			continue
		}
		if bad {
			if !noHead && uint64(badOff/recordSize) >= acked {
				// A batch beyond the witness (ReserveBatch), torn by a
				// crash: its call never returned, nothing it reserved
				// was used; it and what follows are dropped.
				break
			}
			// Something follows the bad record: it was not the last write.
			return corrupt(badOff, "%s", badReason)
		}
		if perr == nil && rec.kind == kindHeader {
			perr = errors.New("header in the middle of the log")
		}
		if perr == nil && rec.flags&flagInbound != 0 && version < formatVersion {
			perr = fmt.Errorf("inbound record in a version %d log", version)
		}
		if perr != nil {
			bad, badOff, badReason = true, off, perr.Error()
			continue
		}
		s.clockBase = max(s.clockBase, rec.clock)
		if rec.kind != kindClock {
			s.apply(rec)
		}
		s.records++
		s.count, s.chain = n, chain
	}
	if off == 0 {
		// Only a compaction creates the file, and its header is synced
		// before the rename.
		if !noHead {
			return corrupt(0, "empty file, but its witness %s acknowledges %d records", s.headPath, acked)
		}
		return corrupt(0, "empty file")
	}
	switch {
	case noHead && version != formatV1:
		return corrupt(0, "its witness %s is missing: the log's length and content cannot be checked", s.headPath)
	case noHead:
		s.log.Info("upgrading a version 1 sequence-number store: it is trusted as it is and gets a witness", "path", s.path)
	case !h.matches(n, chains):
		if bad && uint64(badOff/recordSize) < acked {
			return corrupt(badOff, "%s, in a record its witness %s acknowledges as written", badReason, s.headPath)
		}
		if n < h.pairs[0].count && (len(h.pairs) == 1 || n < h.pairs[1].count) {
			return corrupt(int64(n)*recordSize, "truncated: it holds %d records, its witness %s acknowledges %d", n, s.headPath, acked)
		}
		return corrupt(0, "its records differ from those its witness %s acknowledges (altered, or replaced by another file)", s.headPath)
	}
	if bad {
		s.log.Warn("ignoring a torn last record (a crash during its write, before anything it reserved was used)", "path", s.path, "offset", badOff, "reason", badReason)
	}
	return nil
}

// acks reports whether h acknowledges a log of n records.
func (h head) acks(n uint64) bool {
	for _, p := range h.pairs {
		if p.count == n {
			return true
		}
	}
	return false
}

// matches reports whether a log of n whole records, whose chain after
// each acknowledged count is in chains, starts with what one of h's pairs
// acknowledges.
func (h head) matches(n uint64, chains map[uint64][32]byte) bool {
	for _, p := range h.pairs {
		if c, ok := chains[p.count]; ok && p.count <= n && c == p.chain {
			return true
		}
	}
	return false
}

// apply makes rec the key's current state.
func (s *Store) apply(rec record) {
	if rec.kind == kindRetire && rec.value == 0 && rec.flags&flagInbound == 0 {
		delete(s.entries, rec.fp)
		return
	}
	s.entries[rec.fp] = entry{
		value:   rec.value,
		clock:   uint32(min(rec.clock, 1<<32-1)),
		flags:   rec.flags,
		retired: rec.kind == kindRetire,
	}
}

// appendLocked writes r at the end of the log, syncs it and applies it.
func (s *Store) appendLocked(r record) error {
	r.clock = s.clock()
	s.lastWrite = r.clock
	var b [recordSize]byte
	r.put(&b)
	if err := s.writeLocked(&b); err != nil {
		return err
	}
	s.records++
	s.apply(r)
	if s.compacting {
		s.tail = append(s.tail, b)
	}
	s.maybeCompactLocked()
	return nil
}

// writeLocked appends b to the log, fsyncs it, then acknowledges it in
// the witness, fsynced. A crash between the two leaves a record beyond
// what the witness acknowledges, which Open reads if it is whole and
// valid and ignores if it is not: its call never returned.
func (s *Store) writeLocked(b *[recordSize]byte) error {
	if n, err := s.f.WriteAt(b[:], s.size); err != nil {
		// Cut a partial record off, so that nothing valid follows it.
		if n > 0 {
			if terr := s.f.Truncate(s.size); terr != nil {
				s.err = fmt.Errorf("seqstore: %s: write failed (%v) and the partial record could not be removed (%v)", s.path, err, terr)
			}
		}
		return fmt.Errorf("seqstore: write %s: %w", s.path, err)
	}
	if err := s.f.Sync(); err != nil {
		// After a failed fsync the kernel may have dropped the dirty
		// pages: nothing written since the last good sync can be trusted.
		s.err = fmt.Errorf("seqstore: fsync %s: %w", s.path, err)
		return s.err
	}
	s.size += recordSize
	s.count++
	s.chain = chainNext(s.chain, b[:])
	return s.writeHeadLocked(pair{s.count, s.chain})
}
