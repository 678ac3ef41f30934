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
// that one espd at a time holds with an flock on the directory itself
// (and on its "lock" file, which holds the pid); an append-only log,
// "seq.log": fixed-size records, each with its own CRC-32C, written and
// fsynced before the call returns; and its witness, "seq.head" (head.go),
// which acknowledges, fsynced after each record, how many records the
// log holds and a hash chain over them. Open refuses, with a
// *CorruptError (errors.Is ErrCorrupt), a log shorter than its witness
// says, an acknowledged record damaged or changed, a log missing or empty
// while the witness exists, or a witness missing or unreadable while the
// log exists: espd cannot know which numbers were used, so it must not
// send with any key it might have used before. Only a record beyond what
// the witness acknowledges may be torn by a crash (it was written, its
// call never returned): Open reads it if it is whole and valid and
// ignores it if it is the last. A version 1 log (older espd, no witness)
// is accepted as it is, once, and upgraded. The log is compacted (the
// newest record of each key written to a new file, fsynced, acknowledged
// by the witness with the old log, renamed over the old one, the
// directory fsynced, then acknowledged alone) at Open and whenever it has
// grown by half, without stopping writers for more than the copy of what
// is in memory.
//
// The store also records inbound keys (Inbound, RetireInbound): a key
// serves one direction for ever, and Resume refuses a key that served
// inbound, Inbound a key that served outbound, with ErrDirection.
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
// 75 bytes of memory, so a hub with 10,000 tunnels rekeyed hourly (an
// outbound and an inbound key per tunnel and rekey, 480,000 a day) keeps
// 3.4 million records, about 220 MB of disk and 250 MB of memory, at most
// an eighth more between compactions; 30 days would be about 920 MB and
// 1.1 GB.
const DefaultRetain = 7 * 24 * time.Hour

// File names in the state directory.
const (
	// LogName is the log of sequence-number high-water marks.
	LogName = "seq.log"
	// HeadName is the log's witness (head.go).
	HeadName    = "seq.head"
	lockName    = "lock"
	tmpName     = LogName + ".new"
	headTmpName = HeadName + ".new"
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
	// compactHook, if set, is called at each step of a compaction
	// ("copied", "witnessed", "renamed"); an error stops it there, as a
	// crash would.
	compactHook func(step string) error
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
	inbound    bool // the states are inbound (Inbound, RetireInbound)
}

// Store is an open state directory. Its methods are safe for concurrent
// use.
type Store struct {
	dir, path string
	headPath  string
	opts      Options
	log       *slog.Logger
	lock      *dirLock
	wg        sync.WaitGroup // the background compaction

	mu      sync.Mutex
	f       *os.File // the log, open for writing
	size    int64    // bytes of valid records in f
	records int      // records in f after the header
	head    *os.File // the witness, once there is one
	gen     uint64   // generation of the witness's current slot
	count   uint64   // records in f, header included (0: no log yet)
	chain   [32]byte // chain over them
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
		dir:      dir,
		path:     filepath.Join(dir, LogName),
		headPath: filepath.Join(dir, HeadName),
		opts:     opts,
		log:      log,
		lock:     lock,
		entries:  make(map[crypto.Fingerprint]entry),
		sess:     make(map[crypto.Fingerprint]*session),
	}
	if err := s.load(); err != nil {
		lock.Close()
		return nil, err
	}
	if err := s.openHead(); err != nil {
		lock.Close()
		return nil, err
	}
	s.opened = opts.now()
	// A fresh file: the torn tail (if any) gone, expired records dropped.
	s.mu.Lock()
	err = s.compactLocked()
	s.mu.Unlock()
	if err != nil {
		for _, f := range []*os.File{s.head, s.f} {
			if f != nil {
				f.Close()
			}
		}
		lock.Close()
		return nil, err
	}
	return s, nil
}

// openHead opens the witness for writing, if there is one, with the
// generation of its current slot.
func (s *Store) openHead() error {
	f, err := os.OpenFile(s.headPath, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("seqstore: %w", err)
	}
	h, err := readHead(s.headPath)
	if err != nil {
		f.Close()
		return err
	}
	s.head, s.gen = f, h.gen
	return nil
}

// Path returns the log's path.
func (s *Store) Path() string { return s.path }

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
	if err := s.direction(fp, false); err != nil {
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
	if err := s.direction(fp, false); err != nil {
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
	if err := s.direction(fp, false); err != nil {
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

// ErrDirection: a key used in one direction was given for the other.
var ErrDirection = errors.New("key used in the other direction")

// usedLocked reports whether fp was used (recorded, or resumed by this
// process) outbound and inbound.
func (s *Store) usedLocked(fp crypto.Fingerprint) (out, in bool) {
	if e, ok := s.entries[fp]; ok {
		out, in = e.flags&flagInbound == 0, e.flags&flagInbound != 0
	}
	if ss := s.sess[fp]; ss != nil && ss.users > 0 {
		out, in = out || !ss.inbound, in || ss.inbound
	}
	return out, in
}

// direction returns an error wrapping ErrDirection if fp was used in the
// other direction than inbound says.
func (s *Store) direction(fp crypto.Fingerprint, inbound bool) error {
	out, in := s.usedLocked(fp)
	if inbound && out || !inbound && in {
		was, now := "outbound", "inbound"
		if in {
			was, now = now, was
		}
		return fmt.Errorf("seqstore: key %x was used %s (%s), so it cannot be used %s: a key serves one direction, for ever: %w", fp[:8], was, s.path, now, ErrDirection)
	}
	return nil
}

// Used reports whether fp was ever used outbound and inbound, as far as
// the store knows: retired negotiated keys are forgotten after Retain.
func (s *Store) Used(fp crypto.Fingerprint) (out, in bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return false, false, err
	}
	out, in = s.usedLocked(fp)
	return out, in, nil
}

// Inbound records, durably before it returns, that an inbound state
// uses fp, and counts one more until its RetireInbound. negotiated is as
// for Resume: the record is negotiated while every state of the key was.
// It returns an error wrapping ErrDirection if fp was ever used outbound.
func (s *Store) Inbound(fp crypto.Fingerprint, negotiated bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	if err := s.direction(fp, true); err != nil {
		return err
	}
	ss := s.sess[fp]
	if ss == nil {
		ss = &session{negotiated: true, inbound: true}
	}
	flags := uint8(flagInbound)
	if ss.negotiated && negotiated {
		flags |= flagNegotiated
	}
	e, ok := s.entries[fp]
	if ok {
		flags &= e.flags | flagInbound // never back to negotiated
	}
	if !ok || e.retired || e.flags != flags {
		if err := s.appendLocked(record{kind: kindReserve, flags: flags, fp: fp}); err != nil {
			return err
		}
	}
	s.sess[fp] = ss
	ss.users++
	ss.negotiated = ss.negotiated && negotiated
	return nil
}

// RetireInbound records that an inbound state of fp (one Inbound) is
// gone; with the last of them, the key's record is retired, and its
// retention starts.
func (s *Store) RetireInbound(fp crypto.Fingerprint) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usable(); err != nil {
		return err
	}
	ss := s.sess[fp]
	if ss == nil || !ss.inbound {
		return nil
	}
	if ss.users--; ss.users > 0 {
		return nil
	}
	delete(s.sess, fp)
	e, ok := s.entries[fp]
	if !ok || e.retired {
		return nil
	}
	return s.appendLocked(record{kind: kindRetire, flags: e.flags, fp: fp})
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
		err = s.writeLocked(&b)
	}
	if s.f != nil {
		err = errors.Join(err, s.f.Close())
		s.f = nil
	}
	if s.head != nil {
		err = errors.Join(err, s.head.Close())
		s.head = nil
	}
	return errors.Join(err, s.lock.Close())
}

// Refuse is the store espd uses when its state directory cannot be read:
// it refuses every outbound key with Err, because it cannot know which
// sequence numbers were already sent with it. Inbound states keep
// working, unrecorded.
type Refuse struct{ Err error }

// Resume returns r.Err.
func (r Refuse) Resume(crypto.Fingerprint, bool) (uint64, error) { return 0, r.Err }

// Reserve returns r.Err.
func (r Refuse) Reserve(crypto.Fingerprint, uint64) error { return r.Err }

// Retire returns r.Err.
func (r Refuse) Retire(crypto.Fingerprint, uint64) error { return r.Err }

// Inbound returns nil: inbound states keep working. Their keys are not
// recorded, so a key used inbound now is not refused outbound later; the
// recovery from a refused store (docs/safety.md) installs fresh keys.
func (Refuse) Inbound(crypto.Fingerprint, bool) error { return nil }

// RetireInbound returns nil.
func (Refuse) RetireInbound(crypto.Fingerprint) error { return nil }

// Used knows nothing: it returns false, false, nil (Resume refuses every
// outbound key anyway).
func (Refuse) Used(crypto.Fingerprint) (out, in bool, err error) { return false, false, nil }
