package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// NetnsDir is where ip netns keeps its named namespaces.
const NetnsDir = "/run/netns"

// DefaultRunTimeout bounds Node.Run when the context has no deadline.
const DefaultRunTimeout = 30 * time.Second

// Node is one named network namespace of a topology.
type Node struct {
	// Name is the namespace's name (ip netns exec Name ..., ip -n Name ...).
	Name string
	// Role is the node's place in the line: "client", "gwA", "gwB" or
	// "server".
	Role string

	mu    sync.Mutex
	procs []*Process
}

// ErrNotRoot is returned when the process cannot create network namespaces.
var ErrNotRoot = errors.New("testbed: needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) for network namespaces")

// Available reports whether a test bed can be built here, and if not, why.
// Tests skip with the reason when it returns an error.
func Available() error {
	if os.Geteuid() != 0 {
		return ErrNotRoot
	}
	for _, tool := range []string{"ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("testbed: needs %s (iproute2): %w", tool, err)
		}
	}
	return nil
}

// addNamespace creates the named namespace with its loopback up.
func addNamespace(name string) (*Node, error) {
	if out, err := run(context.Background(), "ip", "netns", "add", name); err != nil {
		return nil, fmt.Errorf("testbed: ip netns add %s: %w: %s", name, err, out)
	}
	n := &Node{Name: name}
	if _, err := n.IP(context.Background(), "link", "set", "lo", "up"); err != nil {
		deleteNamespace(name)
		return nil, err
	}
	return n, nil
}

// NewNodeT creates a namespace of its own for one test of a kernel-facing
// package (tun, routing, daemon, dataplane), named
// <DefaultPrefix>-<role>-<pid>-<n> (role without '-', so that RemoveStale
// can parse the name) with only its loopback, up. t.Cleanup stops the
// processes started in it and removes it, also when the test fails. It
// skips the test, with the reason, when Available reports an error or there
// is no /dev/net/tun, and fails it when the namespace cannot be made.
func NewNodeT(tb testing.TB, role string) *Node {
	tb.Helper()
	if err := Available(); err != nil {
		tb.Skip(err)
	}
	if _, err := os.Stat("/dev/net/tun"); err != nil {
		tb.Skip("testbed: needs /dev/net/tun: ", err)
	}
	name := fmt.Sprintf("%s-%s-%d-%d", DefaultPrefix, role, os.Getpid(), nameSeq.Add(1))
	n, err := addNamespace(name)
	if err != nil {
		tb.Fatal(err)
	}
	n.Role = role
	tb.Cleanup(func() {
		if err := n.Remove(); err != nil {
			tb.Error(err)
		}
	})
	return n
}

// NewNode creates a namespace for a program rather than a test, named
// <prefix>-<role>-<pid>-<n> as NewNodeT names its own (so that RemoveStale
// with the same prefix clears it after a killed run), with only its
// loopback, up. The caller removes it with Remove.
func NewNode(prefix, role string) (*Node, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if prefix == "" {
		prefix = DefaultPrefix
	}
	n, err := addNamespace(fmt.Sprintf("%s-%s-%d-%d", prefix, role, os.Getpid(), nameSeq.Add(1)))
	if err != nil {
		return nil, err
	}
	n.Role = role
	return n, nil
}

// Remove stops the processes started in n and removes its namespace.
func (n *Node) Remove() error {
	return errors.Join(n.stopAll(), deleteNamespace(n.Name))
}

// VethT creates a veth pair between a (end an) and b (end bn) and brings
// both ends up, failing the test on error. The pair disappears with either
// namespace.
func VethT(tb testing.TB, a *Node, an string, b *Node, bn string) {
	tb.Helper()
	a.MustIP(tb, "link", "add", "name", an, "type", "veth", "peer", "name", bn, "netns", b.Name)
	a.MustIP(tb, "link", "set", an, "up")
	b.MustIP(tb, "link", "set", bn, "up")
}

// deleteNamespace removes the named namespace. Links in it disappear with
// it (a veth pair with either end).
func deleteNamespace(name string) error {
	out, err := run(context.Background(), "ip", "netns", "del", name)
	if err != nil {
		if _, serr := os.Stat(filepath.Join(NetnsDir, name)); errors.Is(serr, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("testbed: ip netns del %s: %w: %s", name, err, out)
	}
	return nil
}

// run runs a command with a bound and returns its combined output.
func run(ctx context.Context, name string, args ...string) (string, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultRunTimeout)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 2 * time.Second
	err := cmd.Run()
	if ctx.Err() != nil && err != nil {
		err = fmt.Errorf("%w (%v)", err, ctx.Err())
	}
	return out.String(), err
}

// Run runs argv inside the namespace (ip netns exec) and returns its
// combined output. It is bounded by ctx, or by DefaultRunTimeout when ctx
// has no deadline; a command still running then is killed.
func (n *Node) Run(ctx context.Context, argv ...string) (string, error) {
	if len(argv) == 0 {
		return "", errors.New("testbed: Run without a command")
	}
	out, err := run(ctx, "ip", append([]string{"netns", "exec", n.Name}, argv...)...)
	if err != nil {
		return out, fmt.Errorf("%s: %s: %w: %s", n.Name, strings.Join(argv, " "), err, strings.TrimSpace(out))
	}
	return out, nil
}

// IP runs "ip -n <namespace> args..." and returns its output.
func (n *Node) IP(ctx context.Context, args ...string) (string, error) {
	out, err := run(ctx, "ip", append([]string{"-n", n.Name}, args...)...)
	if err != nil {
		return out, fmt.Errorf("ip -n %s %s: %w: %s", n.Name, strings.Join(args, " "), err, strings.TrimSpace(out))
	}
	return out, nil
}

// MustIP runs "ip -n <namespace> args..." as IP does, with
// DefaultRunTimeout, and fails the test on error. It returns the output.
func (n *Node) MustIP(tb testing.TB, args ...string) string {
	tb.Helper()
	out, err := n.IP(context.Background(), args...)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// Sysctl writes value to /proc/sys/<key> inside the namespace; key uses
// slashes or dots ("net/ipv4/ip_forward", "net.ipv4.ip_forward"). Keys with
// an interface name containing a dot must use slashes.
func (n *Node) Sysctl(key, value string) error {
	if !strings.Contains(key, "/") {
		key = strings.ReplaceAll(key, ".", "/")
	}
	return n.Do(func() error {
		// /proc/sys/net shows the namespace of the thread that opens it.
		return os.WriteFile("/proc/sys/"+key, []byte(value), 0)
	})
}

// Do runs fn on an OS thread switched into the namespace and switches the
// thread back afterwards. Sockets that fn creates belong to the namespace
// for their whole life, so fn typically opens sockets and returns them for
// use from any goroutine. Goroutines that fn starts run outside the
// namespace.
func (n *Node) Do(fn func() error) error {
	target, err := unix.Open(filepath.Join(NetnsDir, n.Name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("testbed: open namespace %s: %w", n.Name, err)
	}
	defer unix.Close(target)
	c := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			c <- fmt.Errorf("testbed: open current namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			c <- fmt.Errorf("testbed: enter namespace %s: %w", n.Name, err)
			return
		}
		var ferr error
		func() {
			defer func() {
				if r := recover(); r != nil {
					ferr = fmt.Errorf("testbed: panic in namespace %s: %v", n.Name, r)
				}
			}()
			ferr = fn()
		}()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err == nil {
			runtime.UnlockOSThread()
		} // else the thread stays locked and exits with this goroutine
		c <- ferr
	}()
	return <-c
}
