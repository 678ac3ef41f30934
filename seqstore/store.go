// Package seqstore keeps, on disk, how far the sequence numbers of every
// outbound key may have gone, so that espd never sends a (key, sequence
// number) pair twice: not after a restart, not after a crash. A repeated
// pair repeats an AES-GCM or ChaCha20-Poly1305 nonce, which gives the key
// away. *Store implements sa.SeqStore: the SA database resumes a key above
// Resume, reserves blocks of sequence numbers ahead with Reserve (durable
// before any of them is sent) and records the exact last number with
// Retire when the state goes.
//
// Keys are known only by their fingerprint (crypto.KeyFingerprint, a
// one-way SHA-256 digest): the store never sees a key, and its file holds
// fingerprints, sequence numbers and a clock, nothing else.
//
// # On disk
//
// A state directory (espd --state-dir, default /var/lib/espd), mode 0700,
// that one espd at a time holds with an flock on its "lock" file, and one
// append-only log, "seq.log": fixed-size records, each with its own
// CRC-32C, written and fsynced before the call returns. A record torn by
// a crash is the file's last one and was never acknowledged, so the
// sequence numbers it would have reserved were never sent: Open ignores
// it. A bad record anywhere else means the file was damaged, and Open
// refuses it with a *CorruptError (errors.Is ErrCorrupt): espd cannot know
// which numbers were used, so it must not send with any key it might have
// used before. The log is compacted (the newest record of each key written
// to a new file, fsynced, renamed over the old one, the directory fsynced)
// at Open and whenever it has grown by half, without stopping writers for
// more than the copy of what is in memory.
//
// # Retention
//
// A key in use (resumed or reserved and not retired) is never dropped.
// Resume says where a key comes from (sa.Config.Negotiated). A manual
// key (espctl, the configuration file, a control client that does not say
// otherwise) may be added again at any time, after any pause, so the
// record of a manual key is kept for ever, retired or not: dropping it
// would let the key start again at sequence number 1. Only a key whose
// every state was negotiated by an IKE daemon, which never installs a key
// again once its CHILD_SA is gone, is recorded as negotiated; its record,
// once retired, is kept for Options.Retain of espd's running time
// (DefaultRetain by default), which covers a restart of espd under the
// IKE daemon (the plugin installs the same keys again within seconds) and
// bounds the disk and memory that retired IKE keys take. A key is
// negotiated only while every Resume of it says so: one manual Resume
// makes its record manual, durably and for good. Records written before
// the origin was recorded have no negotiated flag and are kept for ever.
package seqstore

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/espd/espd/crypto"
)

// DefaultRetain is how long the record of a retired negotiated key is
// kept by default: seven days of espd's running time (the clock stops
// while espd is not running, so a gateway switched off for a month still
// finds its keys). Manual keys' records are kept for ever whatever Retain
// says.
//
// It is long enough for what a negotiated key's retired record is for: an
// espd restart under the IKE daemon (espd stops cleanly, retiring every
// key, and the plugin installs the same keys again within seconds), with
// a wide margin. Keys negotiated by IKE are otherwise never installed
// twice, so for them every retired record is pure cost, and it is that
// cost that bounds the default: a record is 64 bytes on disk and about
// 75 bytes of memory, so a hub with 10,000 tunnels rekeyed hourly (one
// outbound key per tunnel and rekey, 240,000 a day) keeps 1.7 million
// records, about 110 MB of disk and 125 MB of memory, at most an eighth
// more between compactions; 30 days would be about 460 MB and 540 MB.
const DefaultRetain = 7 * 24 * time.Hour

// File names in the state directory.
const (
	// LogName is the log of sequence-number high-water marks.
	LogName  = "seq.log"
	lockName = "lock"
	tmpName  = LogName + ".new"
)

// minCompact is the least number of records in the log before it is
// compacted while open.
const minCompact = 4096

// Errors of Open and the Store's methods; test with errors.Is.
var (
	// ErrCorrupt: the log holds a damaged record; see CorruptError.
	ErrCorrupt = errors.New("sequence-number store corrupt")
	// ErrLocked: another espd holds the state directory.
	ErrLocked = errors.New("state directory locked")
	// ErrClosed: the Store was closed.
	ErrClosed = errors.New("seqstore: closed")
)

// CorruptError says where the log is damaged. espd cannot know which
// sequence numbers were sent with which key, so no outbound state can be
// trusted until the operator intervenes (docs/safety.md).
type CorruptError struct {
	Path   string
	Offset int64
	Reason string
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("sequence-number store %s is corrupt at offset %d (%s): the sequence numbers already sent with each key are unknown, so outbound SAs cannot be trusted (docs/safety.md says how to recover)", e.Path, e.Offset, e.Reason)
}

// Is makes errors.Is(err, ErrCorrupt) true.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// Options tune a Store; the zero value is the default.
type Options struct {
	// Retain is how long, in espd's running time, the record of a retired
	// negotiated key is kept (DefaultRetain if 0; for ever if negative).
	// Keys in use and manual keys are kept regardless.
	Retain time.Duration
	// Logger receives compaction failures; nil discards.
	Logger *slog.Logger

	// now is the clock (time.Now if nil); tests advance a fake one.
	now func() time.Time
	// minCompact overrides the package's minCompact in tests.
	minCompact int
}

// entry is what the store knows of one key. It is kept small: a hub holds
// millions (see DefaultRetain).
type entry struct {
	value   uint64 // highest sequence number that may have been sent
	clock   uint32 // run clock (s) of its last record, for retention
	flags   uint8  // flagNegotiated, flagReused, as written in its last record
	retired bool   // its last record is a retirement
}

// session tracks a key resumed by this process: how many states use it,
// the highest number any of them may have sent, so that a retirement
// never goes below what another state with the same key sent, and whether
// every Resume said the key was negotiated (the origin of its first
// record, written by Reserve).
type session struct {
	users      int
	floor      uint64
	negotiated bool
}

// Store is an open state directory. Its methods are safe for concurrent
// use.
type Store struct {
	dir, path string
	opts      Options
	log       *slog.Logger
	lock      *os.File
	wg        sync.WaitGroup // the background compaction

	mu      sync.Mutex
	f       *os.File // the log, open for writing
	size    int64    // bytes of valid records in f
	records int      // records in f after the header
	entries map[crypto.Fingerprint]entry
	sess    map[crypto.Fingerprint]*session
	err     error // sticky: a failed fsync leaves the file's state unknown
	closed  bool

	clockBase    uint64    // run clock (s) at open, from the file
	opened       time.Time // when the clock started counting again
	lastCompact  uint64    // run clock of the last compaction
	lastWrite    uint64    // run clock of the last record or header
	compacting   bool
	tail         [][recordSize]byte // records appended while compacting
	compactCount int                // compactions done (tests)
}

// Open opens (creating it and the directory if missing) the store in dir
// and takes its lock. It returns a *CorruptError (errors.Is ErrCorrupt) if
// the log is damaged, and an error wrapping ErrLocked if another espd
// holds the directory.
func Open(dir string, opts Options) (*Store, error) {
	if dir == "" {
		return nil, errors.New("seqstore: no state directory")
	}
	if opts.Retain == 0 {
		opts.Retain = DefaultRetain
	}
	if opts.now == nil {
		opts.now = time.Now
	}
	if opts.minCompact <= 0 {
		opts.minCompact = minCompact
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := prepareDir(dir); err != nil {
		return nil, err
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, err
	}
	s := &Store{
		dir:     dir,
		path:    filepath.Join(dir, LogName),
		opts:    opts,
		log:     log,
		lock:    lock,
		entries: make(map[crypto.Fingerprint]entry),
		sess:    make(map[crypto.Fingerprint]*session),
	}
	if err := s.load(); err != nil {
		lock.Close()
		return nil, err
	}
	s.opened = opts.now()
	// A fresh file: the torn tail (if any) gone, expired records dropped.
	s.mu.Lock()
	err = s.compactLocked()
	s.mu.Unlock()
	if err != nil {
		lock.Close()
		return nil, err
	}
	return s, nil
}

// Path returns the log's path.
func (s *Store) Path() string { return s.path }

// load reads the log into entries.
func (s *Store) load() error {
	if err := removeIfExists(filepath.Join(s.dir, tmpName)); err != nil {
		return fmt.Errorf("seqstore: remove unfinished compaction: %w", err)
	}
	f, err := os.Open(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("seqstore: %w", err)
	}
	defer f.Close()
	corrupt := func(off int64, format string, args ...any) error {
		return &CorruptError{Path: s.path, Offset: off, Reason: fmt.Sprintf(format, args...)}
	}
	r := bufio.NewReaderSize(f, 1<<16)
	var buf [recordSize]byte
	var off int64
	bad, badOff, badReason := false, int64(0), ""
	for ; ; off += recordSize {
		n, err := io.ReadFull(r, buf[:])
		if err == io.EOF {
			break
		}
		if err != nil && err != io.ErrUnexpectedEOF {
			return fmt.Errorf("seqstore: read %s: %w", s.path, err)
		}
		if off == 0 {
			// The header is written by a compaction and synced before
			// the rename that makes the file visible: it is never torn.
			h, perr := parse(buf[:n])
			switch {
			case perr != nil:
				return corrupt(0, "header: %v", perr)
			case h.kind != kindHeader || h.fp != magic:
				return corrupt(0, "not a sequence-number store")
			case h.value != formatVersion:
				return corrupt(0, "format version %d, this espd reads %d", h.value, formatVersion)
			}
			s.clockBase = max(s.clockBase, h.clock)
			continue
		}
		rec, perr := parse(buf[:n])
		if bad {
			// Something follows the bad record: it was not the last write.
			return corrupt(badOff, "%s", badReason)
		}
		if perr != nil {
			bad, badOff, badReason = true, off, perr.Error()
			continue
		}
		if rec.kind == kindHeader {
			bad, badOff, badReason = true, off, "header in the middle of the log"
			continue
		}
		s.clockBase = max(s.clockBase, rec.clock)
		if rec.kind != kindClock {
			s.apply(rec)
		}
		s.records++
	}
	if off == 0 {
		// Only a compaction creates the file, and its header is synced
		// before the rename.
		return corrupt(0, "empty file")
	}
	if bad {
		s.log.Warn("ignoring a torn last record (a crash during its write, before anything it reserved was used)", "path", s.path, "offset", badOff, "reason", badReason)
	}
	return nil
}

// apply makes rec the key's current state.
func (s *Store) apply(rec record) {
	if rec.kind == kindRetire && rec.value == 0 {
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

// clock returns the run clock in seconds: the time espd has had the store
// open, across runs.
func (s *Store) clock() uint64 {
	d := s.opts.now().Sub(s.opened)
	if d < 0 {
		d = 0
	}
	return s.clockBase + uint64(d/time.Second)
}

// usable returns why the store cannot be used, or nil.
func (s *Store) usable() error {
	if s.closed {
		return ErrClosed
	}
	return s.err
}

// Resume returns the highest sequence number that may have been sent with
// fp (0: never used) and counts one more state using fp until its Retire.
// negotiated says that the state's keys were negotiated by an IKE daemon
// (sa.Config.Negotiated). A manual Resume of a key recorded as negotiated
// makes its record manual (kept for ever), durably before it returns; a
// negotiated Resume never makes a manual record negotiated.
func (s *Store) Resume(fp crypto.Fingerprint, negotiated bool) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return 0, err
	}
	e, ok := s.entries[fp]
	if ok && !negotiated && e.flags&flagNegotiated != 0 {
		r := record{kind: kindReserve, flags: e.flags &^ flagNegotiated, value: e.value, fp: fp}
		if e.retired {
			r.kind = kindRetire
		}
		if err := s.appendLocked(r); err != nil {
			return 0, err
		}
	}
	ss := s.sess[fp]
	if ss == nil {
		ss = &session{negotiated: true}
		s.sess[fp] = ss
	}
	ss.users++
	ss.floor = max(ss.floor, e.value)
	ss.negotiated = ss.negotiated && negotiated
	return e.value, nil
}

// flagsLocked returns the flags of fp's next record: those of its current
// record e (ok), or, for its first record, the origin its Resumes gave
// (manual without one).
func (s *Store) flagsLocked(fp crypto.Fingerprint, e entry, ok bool) uint8 {
	if ok {
		return e.flags
	}
	if ss := s.sess[fp]; ss != nil && ss.negotiated {
		return flagNegotiated
	}
	return 0
}

// Reserve records, durably before it returns, that sequence numbers up to
// limit may be sent with fp. A limit at or below what is recorded changes
// nothing.
func (s *Store) Reserve(fp crypto.Fingerprint, limit uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	e, ok := s.entries[fp]
	r := record{kind: kindReserve, flags: s.flagsLocked(fp, e, ok), value: max(e.value, limit), fp: fp}
	if ok && !e.retired && r.value == e.value && r.flags == e.flags {
		return nil
	}
	if r.value == 0 {
		return nil
	}
	return s.appendLocked(r)
}

// Retire records that a state keyed with fp is gone after sending exactly
// up to last. When it was the last state of this process using fp (one
// Retire per Resume), the record goes down to last, so that the key, added
// again, continues right after it; while another state uses fp, or if fp
// was never resumed, it never goes down.
func (s *Store) Retire(fp crypto.Fingerprint, last uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	e, ok := s.entries[fp]
	r := record{kind: kindRetire, flags: s.flagsLocked(fp, e, ok), value: max(e.value, last), fp: fp}
	ss := s.sess[fp]
	if ss != nil && ss.users > 0 {
		ss.floor = max(ss.floor, last)
		if ss.users--; ss.users > 0 {
			r.kind = kindReserve // others still send with fp
		} else {
			r.value = ss.floor
			delete(s.sess, fp)
		}
	}
	if !ok && r.value == 0 {
		return nil
	}
	if ok && r.value == e.value && r.flags == e.flags && (r.kind == kindRetire) == e.retired {
		return nil
	}
	return s.appendLocked(r)
}

// appendLocked writes r at the end of the log, syncs it and applies it.
func (s *Store) appendLocked(r record) error {
	r.clock = s.clock()
	s.lastWrite = r.clock
	var b [recordSize]byte
	r.put(&b)
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
	s.records++
	s.apply(r)
	if s.compacting {
		s.tail = append(s.tail, b)
	}
	s.maybeCompactLocked()
	return nil
}

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

	// The long part, without the lock.
	s.mu.Unlock()
	err = f.Sync()
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
	if err := os.Rename(tmp, s.path); err != nil {
		return fmt.Errorf("seqstore: %w", err)
	}
	renamed = true
	// From here on the new file is the log, whatever happens next.
	if s.f != nil {
		s.f.Close()
	}
	s.f, s.size, s.records = f, size, n
	s.lastCompact, s.lastWrite = now, max(s.lastWrite, now)
	s.compactCount++
	if err := syncDir(s.dir); err != nil {
		// The rename may not survive a crash; either file is complete.
		return fmt.Errorf("seqstore: fsync directory %s: %w", s.dir, err)
	}
	if dropped > 0 {
		s.log.Debug("compacted the sequence-number store", "path", s.path, "records", n, "dropped", dropped)
	}
	return nil
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

// Close waits for a running compaction, closes the log and releases the
// directory. Later calls of the Store's methods return ErrClosed.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	if s.f != nil && s.err == nil && s.clock() > s.lastWrite {
		// Keep the time espd ran for retention. Without it (a crash)
		// records are only kept longer.
		var b [recordSize]byte
		(&record{kind: kindClock, clock: s.clock()}).put(&b)
		if _, err = s.f.WriteAt(b[:], s.size); err == nil {
			err = s.f.Sync()
		}
	}
	if s.f != nil {
		err = errors.Join(err, s.f.Close())
		s.f = nil
	}
	return errors.Join(err, s.lock.Close())
}

// Refuse is the store espd uses when its state directory cannot be read:
// it refuses every outbound key with Err, because it cannot know which
// sequence numbers were already sent with it. Inbound states do not use a
// store and keep working.
type Refuse struct{ Err error }

// Resume returns r.Err.
func (r Refuse) Resume(crypto.Fingerprint, bool) (uint64, error) { return 0, r.Err }

// Reserve returns r.Err.
func (r Refuse) Reserve(crypto.Fingerprint, uint64) error { return r.Err }

// Retire returns r.Err.
func (r Refuse) Retire(crypto.Fingerprint, uint64) error { return r.Err }
