package seqstore

import (
	"errors"
	"fmt"
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
	// ErrUnsafeDir: the state directory is not a directory, or others
	// could write to it (its mode or its owner).
	ErrUnsafeDir = errors.New("state directory unsafe")
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
