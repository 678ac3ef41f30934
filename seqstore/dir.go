package seqstore

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// prepareDir creates dir (0700) if it is missing and refuses one that
// another user could change: group- or world-writable, or owned by
// someone other than espd's user or root.
func prepareDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("seqstore: state directory: %w", err)
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("seqstore: state directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("seqstore: state directory %s is not a directory: %w", dir, ErrUnsafeDir)
	}
	if fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("seqstore: state directory %s has mode %04o: others could replace the record of used sequence numbers; make it writable by its owner only (chmod go-w): %w", dir, fi.Mode().Perm(), ErrUnsafeDir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if uid := os.Geteuid(); st.Uid != uint32(uid) && st.Uid != 0 {
			return fmt.Errorf("seqstore: state directory %s is owned by uid %d, not by espd's user (uid %d) or root: %w", dir, st.Uid, uid, ErrUnsafeDir)
		}
	}
	return nil
}

// dirLock is an Open's hold on its state directory.
type dirLock struct{ dir, file *os.File }

// Close releases the directory.
func (l *dirLock) Close() error { return errors.Join(l.file.Close(), l.dir.Close()) }

// lockDir takes an exclusive flock on dir itself, which cannot be removed
// from under its holder as a file can, and on its lock file, which holds
// the pid of the espd that owns the directory (and which earlier espd
// versions lock). It fails at once, with ErrLocked, if another process (or
// another Open in this one) holds either.
func lockDir(dir string) (*dirLock, error) {
	path := filepath.Join(dir, lockName)
	locked := func() error {
		who := "another espd"
		if b, rerr := os.ReadFile(path); rerr == nil {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 {
				who = fmt.Sprintf("another espd (pid %d)", pid)
			}
		}
		return fmt.Errorf("seqstore: state directory %s is in use by %s: %w", dir, who, ErrLocked)
	}
	d, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("seqstore: lock: %w", err)
	}
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		d.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, locked()
		}
		return nil, fmt.Errorf("seqstore: lock %s: %w", dir, err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("seqstore: lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		d.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, locked()
		}
		return nil, fmt.Errorf("seqstore: lock %s: %w", path, err)
	}
	// Informational only: the flocks are the lock.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &dirLock{dir: d, file: f}, nil
}

// syncDir makes a rename or a creation in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// removeIfExists removes path, ignoring its absence.
func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
