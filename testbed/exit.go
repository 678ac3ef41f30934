package testbed

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// cldExited is CLD_EXITED, si_code of a child that called exit.
const cldExited = 1

// exitStatus is how a process ended, as waitid(2) reports it.
type exitStatus struct {
	status int            // exit status, when signal is 0
	signal syscall.Signal // the signal that ended it, or 0
}

// waitExited waits until the child pid has exited and returns how,
// leaving it unreaped (WNOWAIT): Process.reap reaps it.
func waitExited(pid int) exitStatus {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return exitStatus{status: -1}
		}
		// struct siginfo for SIGCHLD: si_pid and si_uid at 16, si_status
		// at 24 (the same on every 64-bit Linux).
		st := *(*int32)(unsafe.Add(unsafe.Pointer(&info), 24))
		if info.Code == cldExited {
			return exitStatus{status: int(st)}
		}
		return exitStatus{status: -1, signal: syscall.Signal(st)}
	}
}

// code is the exit status, or -1 if a signal ended the process.
func (e exitStatus) code() int {
	if e.signal != 0 {
		return -1
	}
	return e.status
}

// err is nil for an exit with status 0, else what exec.ExitError says.
func (e exitStatus) err() error {
	switch {
	case e.signal != 0:
		return fmt.Errorf("signal: %v", e.signal)
	case e.status != 0:
		return fmt.Errorf("exit status %d", e.status)
	}
	return nil
}
