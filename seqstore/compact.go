package seqstore

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/espd/espd/crypto"
)

// maybeCompactLocked starts a compaction in the background when the log
// has grown by half over the keys it holds, or when retired records may
// have aged out (every eighth of Retain).
func (s *Store) maybeCompactLocked() {
	if s.compacting || s.closed || s.records < s.opts.minCompact {
		return
	}
	grown := s.records >= len(s.entries)+len(s.entries)/2
	aged := s.opts.Retain > 0 && s.clock()-s.lastCompact >= uint64(s.opts.Retain/8/time.Second)
	if !grown && !aged {
		return
	}
	s.compacting = true
	s.tail = s.tail[:0]
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.mu.Lock()
		defer s.mu.Unlock()
		if err := s.compactLocked(); err != nil && !s.closed {
			s.log.Error("compaction of the sequence-number store failed; the log stays as it is", "path", s.path, "err", err)
		}
	}()
}

// compactLocked writes every kept entry to a new file and renames it over
// the log. It holds s.mu while it copies the entries (memory to page
// cache) and for the final steps, but not during the long fsync of the
// copy: records appended meanwhile go to the old log and to s.tail, and
// are written to the new file before it replaces the old one.
func (s *Store) compactLocked() (err error) {
	s.compacting = true
	s.tail = s.tail[:0]
	defer func() { s.compacting = false; s.tail = nil }()
	if err := s.usable(); err != nil {
		return err
	}
	tmp := filepath.Join(s.dir, tmpName)
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("seqstore: %w", err)
	}
	renamed := false
	defer func() {
		if !renamed {
			f.Close()
			os.Remove(tmp)
		}
	}()
	now := s.clock()
	w := bufio.NewWriterSize(f, 1<<16)
	var b [recordSize]byte
	hdr := record{kind: kindHeader, value: formatVersion, clock: now, fp: magic}
	hdr.put(&b)
	w.Write(b[:])
	n, dropped := 0, 0
	for fp, e := range s.entries {
		if s.expired(fp, e, now) {
			delete(s.entries, fp)
			dropped++
			continue
		}
		r := record{kind: kindReserve, flags: e.flags, value: e.value, clock: uint64(e.clock), fp: fp}
		if e.retired {
			r.kind = kindRetire
		}
		r.put(&b)
		w.Write(b[:])
		n++
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("seqstore: write %s: %w", tmp, err)
	}

	// The long part, without the lock: the copy's chain (read back from
	// the page cache) and its fsync.
	s.mu.Unlock()
	chain, err := chainFile(f, uint64(1+n))
	if err == nil {
		err = f.Sync()
	}
	s.mu.Lock()
	if err != nil {
		return fmt.Errorf("seqstore: fsync %s: %w", tmp, err)
	}
	if err := s.usable(); err != nil {
		return err
	}
	size := int64(1+n) * recordSize
	if len(s.tail) > 0 {
		buf := make([]byte, 0, len(s.tail)*recordSize)
		for i := range s.tail {
			buf = append(buf, s.tail[i][:]...)
			chain = chainNext(chain, s.tail[i][:])
		}
		if _, err := f.WriteAt(buf, size); err != nil {
			return fmt.Errorf("seqstore: write %s: %w", tmp, err)
		}
		if err := f.Sync(); err != nil {
			return fmt.Errorf("seqstore: fsync %s: %w", tmp, err)
		}
		size += int64(len(buf))
		n += len(s.tail)
	}
	next := pair{uint64(1 + n), chain}
	// The copy is complete and durable. A crash before the witness's
	// next slot is durable leaves the old log and a witness that
	// acknowledges it (Open removes the copy).
	if err := s.hook("copied"); err != nil {
		return err
	}
	// The witness acknowledges both logs, durably, before either is
	// replaced: a crash from here until the last slot is durable finds
	// the old log or the new one under its name, and either matches.
	// (Without a witness yet, an upgrade or a new directory, it is
	// created with that slot by a rename: a crash before it leaves no
	// witness and the old log, or none.)
	if err := s.writeHeadLocked(pair{s.count, s.chain}, next); err != nil {
		return err
	}
	if err := s.hook("witnessed"); err != nil {
		return err
	}
	if err := os.Rename(tmp, s.path); err != nil {
		// The old log stays; the next write's slot acknowledges it alone.
		return fmt.Errorf("seqstore: %w", err)
	}
	renamed = true
	// From here on the new file is the log, whatever happens next.
	if s.f != nil {
		s.f.Close()
	}
	s.f, s.size, s.records = f, size, n
	s.count, s.chain = next.count, next.chain
	s.lastCompact, s.lastWrite = now, max(s.lastWrite, now)
	s.compactCount++
	if err := s.hook("renamed"); err != nil {
		return err
	}
	if err := syncDir(s.dir); err != nil {
		// The rename may not survive a crash: the witness must go on
		// acknowledging the old log, so nothing more can be written.
		s.err = fmt.Errorf("seqstore: fsync directory %s: %w", s.dir, err)
		return s.err
	}
	// The new log alone. A crash while this slot is written leaves the
	// previous one, which acknowledges the new log too.
	if err := s.writeHeadLocked(next); err != nil {
		return err
	}
	if dropped > 0 {
		s.log.Debug("compacted the sequence-number store", "path", s.path, "records", n, "dropped", dropped)
	}
	return nil
}

// hook runs the test hook at a step of compaction; its error stands for
// a crash there.
func (s *Store) hook(step string) error {
	if s.opts.compactHook == nil {
		return nil
	}
	return s.opts.compactHook(step)
}

// expired reports whether e, a retired negotiated key's record, has
// outlived Retain. A manual key's record (no flagNegotiated, which every
// record with flagReused also lacks) never expires.
func (s *Store) expired(fp crypto.Fingerprint, e entry, now uint64) bool {
	if !e.retired || e.flags&flagNegotiated == 0 || e.flags&flagReused != 0 || s.opts.Retain < 0 || s.sess[fp] != nil {
		return false
	}
	return now-min(now, uint64(e.clock)) > uint64(s.opts.Retain/time.Second)
}
