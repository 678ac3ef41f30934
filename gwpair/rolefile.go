package gwpair

import (
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// maxRoleFile is the largest role file readRoleFile reads: "standby\n"
// with room to spare.
const maxRoleFile = 64

// readRoleFile reads the pair's role file (PairOptions.RoleFile), which
// keepalived's notify script writes as root into a directory of root's
// (docs/ha.md). Whoever may write the file chooses the node's role, so it
// opens the file once without following a symbolic link in its last
// element and without blocking on a FIFO, and refuses, on the open file,
// anything but a regular file of root's or espd's own user that no one
// else may write (mode bits 0022). A missing file is fs.ErrNotExist.
func readRoleFile(path string) ([]byte, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err == unix.ELOOP {
		return nil, fmt.Errorf("%s is a symbolic link: name the role file itself", path)
	}
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%v)", path, fi.Mode().Type())
	}
	if m := fi.Mode().Perm(); m&0o022 != 0 {
		return nil, fmt.Errorf("%s: mode %04o lets others write it: chmod go-w it", path, m)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || (st.Uid != 0 && int(st.Uid) != os.Geteuid()) {
		return nil, fmt.Errorf("%s: owned by uid %d, not root or espd's user (uid %d): chown root it", path, ownerOf(fi), os.Geteuid())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxRoleFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxRoleFile {
		return nil, fmt.Errorf("%s: more than %d bytes: not a role file", path, maxRoleFile)
	}
	return b, nil
}

// ownerOf is fi's owner's uid, or -1 if fi does not say.
func ownerOf(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}
