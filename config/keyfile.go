package config

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Every key read from a file (the configuration file's enc_key_file and
// integ_key_file, espctl's --enc-key-file and --integ-key-file, espd's
// --pair-key-file) is opened by OpenKeyFile, which keeps one rule, checked
// on the open descriptor so that the file checked is the file read:
//   - the name's last element is not a symbolic link (O_NOFOLLOW);
//   - the file is a regular file;
//   - users other than its owner and group may neither read nor write it
//     (mode bits 0006);
//   - its owner is root or the user the reader runs as (effective uid).
//
// Under the packaged units (User=espd) that is root:espd 0640.

// Errors that the refusals of OpenKeyFile wrap.
var (
	// ErrKeyFileMode: users other than the owner and group may read or
	// write the file.
	ErrKeyFileMode = errors.New("key file is accessible to other users")
	// ErrKeyFileOwner: the file's owner is neither root nor the reader.
	ErrKeyFileOwner = errors.New("key file belongs to another user")
	// ErrKeyFileType: the name is a symbolic link, or the file is not a
	// regular file (a directory, a FIFO, a device).
	ErrKeyFileType = errors.New("key file is not a regular file")
)

// OpenKeyFile opens the key file at path for reading, once, without
// following a symbolic link in its last element and without blocking on a
// FIFO, and checks the open file against the rule above. Its errors name
// the file (after name, the key it holds), its owner and mode, and the
// fix; they never hold key material.
func OpenKeyFile(name, path string) (*os.File, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, openError(name, path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	if err := checkKeyFile(path, fi); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s %s: %w", name, path, err)
	}
	return f, nil
}

// openError explains why the key file at path could not be opened: a
// symbolic link, or a file the reader may not read (its owner and mode,
// and the fix), or else err as it is.
func openError(name, path string, err error) error {
	switch {
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("%s %s: %w: it is a symbolic link; name the key file itself (whoever can change the link chooses the key)",
			name, path, ErrKeyFileType)
	case errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM):
		var st unix.Stat_t
		if unix.Lstat(path, &st) != nil {
			return fmt.Errorf("%s %s: permission denied to %s: let it reach the file (install -d -m 0750 -o root -g %s DIR) and %s",
				name, path, who(os.Geteuid()), groupName(os.Getegid()), fix(path))
		}
		return fmt.Errorf("%s %s: permission denied: owner %s, group %s, mode %04o, and the reader runs as %s: %s",
			name, path, who(int(st.Uid)), group(int(st.Gid)), st.Mode&0o7777, who(os.Geteuid()), fix(path))
	}
	return fmt.Errorf("%s: %w", name, &fs.PathError{Op: "open", Path: path, Err: err})
}

// checkKeyFile applies the rule above to the open file's fi.
func checkKeyFile(path string, fi os.FileInfo) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%w (%s): name the file that holds the key", ErrKeyFileType, fileType(fi.Mode()))
	}
	m := fi.Mode().Perm()
	if err := CheckKeyFileMode(fi); err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%w: its owner cannot be read", ErrKeyFileOwner)
	}
	uid := int(st.Uid)
	if uid != 0 && uid != os.Geteuid() {
		owners := "root"
		if os.Geteuid() != 0 {
			owners += " or " + who(os.Geteuid()) + ", the user reading it"
		}
		return fmt.Errorf("%w: owner %s, group %s, mode %04o; a key file must be owned by %s: %s",
			ErrKeyFileOwner, who(uid), group(int(st.Gid)), m, owners, fix(path))
	}
	return nil
}

// CheckKeyFileMode refuses a key file that users other than its owner and
// group may read or write (mode bits 0006).
func CheckKeyFileMode(fi os.FileInfo) error {
	if m := fi.Mode().Perm(); m&0o006 != 0 {
		return fmt.Errorf("%w (mode %04o): anyone on the machine could read or replace the key; chmod o-rw it (0600 or 0640)", ErrKeyFileMode, m)
	}
	return nil
}

// fix is the command that makes path a key file the reader may read and
// no one else: group espd, if root reads it and that group exists (the
// packaged units' espd reads it too), else the reader's group.
func fix(path string) string {
	g := groupName(os.Getegid())
	if _, err := lookupGroup("espd"); err == nil && os.Getegid() == 0 {
		g = "espd"
	}
	return fmt.Sprintf("chown root:%s %s; chmod 0640 %s", g, path, path)
}

// lookupGroup is user.LookupGroup; a test replaces it to see both fixes.
var lookupGroup = user.LookupGroup

// fileType names a mode's file type.
func fileType(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "type " + m.Type().String()
}

// who names the user uid: "espd (uid 998)", or "uid 12345" if it has no name.
func who(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		return fmt.Sprintf("%s (uid %d)", u.Username, uid)
	}
	return fmt.Sprintf("uid %d", uid)
}

// group names the group gid: "espd (gid 998)", or "gid 12345".
func group(gid int) string {
	if n := groupName(gid); n != strconv.Itoa(gid) {
		return fmt.Sprintf("%s (gid %d)", n, gid)
	}
	return fmt.Sprintf("gid %d", gid)
}

// groupName is the group gid's name, or its number if it has none.
func groupName(gid int) string {
	if g, err := user.LookupGroupId(strconv.Itoa(gid)); err == nil {
		return g.Name
	}
	return strconv.Itoa(gid)
}
