package testbed

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// DefaultStopGrace is how long Process.Stop waits after SIGTERM before it
// sends SIGKILL.
const DefaultStopGrace = 10 * time.Second

// Process is a long-running command started in a namespace with
// Node.Start.
type Process struct {
	// Name labels the process in errors.
	Name string
	// LogPath is the file that receives its stdout and stderr.
	LogPath string

	cmd      *exec.Cmd
	log      *os.File
	done     chan struct{} // closed when the process has exited (not yet reaped)
	exit     exitStatus    // set before done is closed
	waitErr  error         // set before done is closed
	reapOnce sync.Once
	stopOnce sync.Once
	stopErr  error
	stopping atomic.Bool
}

// Start starts argv inside the namespace (ip netns exec, which execs argv
// so the process keeps its pid) with stdout and stderr appended to
// logPath. The process is stopped by Stop, or by Topology.Close at the
// latest.
func (n *Node) Start(logPath string, argv ...string) (*Process, error) {
	if len(argv) == 0 {
		return nil, errors.New("testbed: Start without a command")
	}
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("testbed: log file: %w", err)
	}
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.Name}, argv...)...)
	cmd.Stdout, cmd.Stderr = f, f
	// Its own process group: a Ctrl-C at the terminal reaches the harness,
	// which then stops the process in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("testbed: start %s in %s: %w", strings.Join(argv, " "), n.Name, err)
	}
	p := &Process{
		Name:    fmt.Sprintf("%s@%s", argv[0], n.Role),
		LogPath: logPath,
		cmd:     cmd,
		log:     f,
		done:    make(chan struct{}),
	}
	go func() {
		p.exit = waitExited(cmd.Process.Pid)
		p.waitErr = p.exit.err()
		close(p.done)
	}()
	n.mu.Lock()
	n.procs = append(n.procs, p)
	n.mu.Unlock()
	return p, nil
}

// Pid returns the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process (for example SIGHUP).
func (p *Process) Signal(sig os.Signal) error {
	select {
	case <-p.done:
		return fmt.Errorf("testbed: %s has exited: %v", p.Name, p.waitErr)
	default:
	}
	return p.cmd.Process.Signal(sig)
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited, and its Wait error.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.waitErr
	default:
		return false, nil
	}
}

// Stop sends SIGTERM to the process, waits up to grace (DefaultStopGrace if
// 0) for it to exit and then sends SIGKILL to its whole process group. It
// returns an error if the process had to be killed or exited with a
// failure status; dying of the SIGTERM itself counts as a clean exit. An
// exit that happened before Stop is reported as it was. Later calls return
// the first result.
func (p *Process) Stop(grace time.Duration) error {
	p.stopping.Store(true)
	p.stopOnce.Do(func() {
		if grace <= 0 {
			grace = DefaultStopGrace
		}
		defer p.reap()
		select {
		case <-p.done:
			if p.waitErr != nil {
				p.stopErr = fmt.Errorf("testbed: %s had exited before Stop: %w", p.Name, p.waitErr)
			}
			return
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
			if p.waitErr != nil && p.exit.signal != syscall.SIGTERM {
				p.stopErr = fmt.Errorf("testbed: %s exited after SIGTERM: %w", p.Name, p.waitErr)
			}
		case <-time.After(grace):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
			p.stopErr = fmt.Errorf("testbed: %s ignored SIGTERM for %v and was killed; its log ends:\n%s", p.Name, grace, Tail(p.Log(), 30))
		}
	})
	return p.stopErr
}

// ExitCode returns the exit status once the process has exited (-1 if a
// signal ended it), and false while it runs.
func (p *Process) ExitCode() (int, bool) {
	select {
	case <-p.done:
		return p.exit.code(), true
	default:
		return 0, false
	}
}

// Log returns the process's log so far.
func (p *Process) Log() string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", p.LogPath, err)
	}
	return string(b)
}

// stopAll stops the node's processes, newest first.
func (n *Node) stopAll() error {
	n.mu.Lock()
	procs := n.procs
	n.procs = nil
	n.mu.Unlock()
	var errs []error
	for i := len(procs) - 1; i >= 0; i-- {
		if procs[i].stopping.Swap(true) {
			continue // the caller stopped it and saw the result
		}
		errs = append(errs, procs[i].Stop(0))
	}
	return errors.Join(errs...)
}

// reap kills what the process left behind in its group and then reaps it.
// Until it is reaped, the exited process keeps its PID, and so its
// process group's ID, from being given to another process: the group
// kill cannot reach a process that merely reuses the number (with
// kernel.pid_max at 32768 and many processes per test, a stale one
// would, and test binaries run side by side).
func (p *Process) reap() {
	<-p.done
	p.reapOnce.Do(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		_ = p.cmd.Wait()
		p.log.Close()
	})
}
