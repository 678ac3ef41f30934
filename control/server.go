package control

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/espd/espd/control/wire"
	"golang.org/x/sys/unix"
)

// DefaultSocketPath is where espd listens unless told otherwise.
const DefaultSocketPath = "/run/espd/espd.sock"

// ServerConfig tunes a Server. Zero fields take their defaults.
type ServerConfig struct {
	// Path is the socket's path; default DefaultSocketPath. Its directory
	// is created if missing, mode 0700 (0750 and owned by Group when one
	// is given).
	Path string
	// Group, a group name or a numeric gid, lets the members of the group
	// use the socket besides root: the socket is then mode 0660 and owned
	// by the group. Empty: root only (mode 0600).
	Group string
	// MaxConns bounds the connections served at once; default 64. A
	// newcomer is always admitted: at the limit the server closes another
	// connection to make room, chosen among those of the peer uid that
	// holds the most: one neither subscribed to events nor registered for
	// the IKE hand-off if there is one, between messages rather than in
	// the middle of one, and the least recently active. It gets an EAGAIN
	// ERROR, and a log line (at most one per EvictLogInterval) says that
	// the limit was reached and whom it closed.
	MaxConns int
	// MessageTimeout bounds how long the rest of a message may take once
	// its first byte arrived; default 5 s. ETIMEDOUT, then disconnect.
	MessageTimeout time.Duration
	// IdleTimeout disconnects a client that sends nothing for this long,
	// unless it is subscribed to events or registered for the IKE
	// hand-off; default DefaultIdleTimeout, negative: never.
	IdleTimeout time.Duration
	// WriteTimeout bounds each write to a client; a client that does not
	// read for this long is disconnected. Default 5 s.
	WriteTimeout time.Duration
	// EventQueue is how many events wait for a subscriber before new ones
	// are dropped and counted; default 1024.
	EventQueue int
	// Logf logs refused peers and broken connections; nil: silent.
	Logf func(format string, args ...any)
}

func (c *ServerConfig) setDefaults() {
	if c.Path == "" {
		c.Path = DefaultSocketPath
	}
	if c.MaxConns <= 0 {
		c.MaxConns = 64
	}
	if c.MessageTimeout <= 0 {
		c.MessageTimeout = 5 * time.Second
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 5 * time.Second
	}
	if c.EventQueue <= 0 {
		c.EventQueue = 1024
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

// DefaultIdleTimeout is how long a connection that is neither subscribed
// to events nor registered for the IKE hand-off may stay silent before the
// server closes it (ETIMEDOUT). Clients that keep a connection for
// requests, as charon's plugin does, reconnect when they next need it.
const DefaultIdleTimeout = 60 * time.Second

// EvictLogInterval is the least time between two log lines about
// connections closed at the MaxConns limit; the next line counts those
// that were not logged.
const EvictLogInterval = 10 * time.Second

// maxSkip is the largest oversized message the server reads past to keep
// the connection; beyond it the connection is closed.
const maxSkip = 1 << 20

// Server serves the control protocol on a Unix socket.
type Server struct {
	backend Backend
	cfg     ServerConfig
	ln      *net.UnixListener
	gid     int // -1: root only

	mu sync.Mutex
	// isMember reports whether uid has gid among its groups; replaceable
	// in tests.
	isMember func(uid, gid uint32) bool
	conns    map[*conn]struct{}
	evicting int // conns closed by evict whose goroutine has not ended
	evictLog evictLog
	closed   bool
	wg       sync.WaitGroup

	active   atomic.Int64
	accepted atomic.Uint64
	refused  atomic.Uint64
	evicted  atomic.Uint64
}

// Listen creates the socket (and its directory) and returns a Server ready
// to Serve. A stale socket file is replaced; one with a live server behind
// it is an error.
func Listen(b Backend, cfg ServerConfig) (*Server, error) {
	if b == nil {
		return nil, errors.New("control: nil Backend")
	}
	cfg.setDefaults()
	s := &Server{backend: b, cfg: cfg, gid: -1, conns: map[*conn]struct{}{}, isMember: userInGroup}
	if cfg.Group != "" {
		gid, err := lookupGroup(cfg.Group)
		if err != nil {
			return nil, err
		}
		s.gid = gid
	}
	dir := filepath.Dir(cfg.Path)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		mode := os.FileMode(0o700)
		if s.gid >= 0 {
			mode = 0o750
		}
		if err := os.MkdirAll(dir, mode); err != nil {
			return nil, fmt.Errorf("control: %w", err)
		}
		if err := os.Chmod(dir, mode); err != nil {
			return nil, fmt.Errorf("control: %w", err)
		}
		if s.gid >= 0 {
			if err := os.Chown(dir, -1, s.gid); err != nil {
				return nil, fmt.Errorf("control: %w", err)
			}
		}
	}
	if fi, err := os.Lstat(cfg.Path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("control: %s exists and is not a socket", cfg.Path)
		}
		if c, err := net.DialTimeout("unix", cfg.Path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("control: %s is in use by a running server", cfg.Path)
		}
		if err := os.Remove(cfg.Path); err != nil {
			return nil, fmt.Errorf("control: removing stale socket: %w", err)
		}
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: cfg.Path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	mode := os.FileMode(0o600)
	if s.gid >= 0 {
		mode = 0o660
		if err := os.Chown(cfg.Path, -1, s.gid); err != nil {
			ln.Close()
			return nil, fmt.Errorf("control: %w", err)
		}
	}
	if err := os.Chmod(cfg.Path, mode); err != nil {
		ln.Close()
		return nil, fmt.Errorf("control: %w", err)
	}
	s.ln = ln
	return s, nil
}

// lookupGroup resolves a group name or numeric gid.
func lookupGroup(g string) (int, error) {
	if n, err := strconv.Atoi(g); err == nil && n >= 0 {
		return n, nil
	}
	gr, err := user.LookupGroup(g)
	if err != nil {
		return 0, fmt.Errorf("control: group %q: %w", g, err)
	}
	return strconv.Atoi(gr.Gid)
}

// userInGroup reports whether the user uid has gid among its supplementary
// groups (from the user and group databases).
func userInGroup(uid, gid uint32) bool {
	u, err := user.LookupId(strconv.FormatUint(uint64(uid), 10))
	if err != nil {
		return false
	}
	ids, err := u.GroupIds()
	if err != nil {
		return false
	}
	return slices.Contains(ids, strconv.FormatUint(uint64(gid), 10))
}

// Path returns the socket's path.
func (s *Server) Path() string { return s.cfg.Path }

// Serve accepts connections until Close. It returns nil after Close.
func (s *Server) Serve() error {
	var backoff time.Duration
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.cfg.Logf("control: accept: %v; retrying in %v", err, backoff)
				time.Sleep(backoff)
				continue
			}
			return fmt.Errorf("control: accept: %w", err)
		}
		backoff = 0
		s.admit(c)
	}
}

// admit takes a connection slot, evicting another connection if none is
// free, and starts the connection's goroutine, which checks the peer's
// credentials (the group lookup may be slow: it must not hold up the
// accept loop) and serves it.
func (s *Server) admit(c *net.UnixConn) {
	cred, err := peerCred(c)
	if err != nil {
		s.refused.Add(1)
		s.cfg.Logf("control: refused peer: %v", err)
		s.refuse(c, err)
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		c.Close()
		return
	}
	cn := newConn(s, c, cred)
	var report string
	if len(s.conns)-s.evicting >= s.cfg.MaxConns {
		report = s.evictLocked(cn)
	}
	s.conns[cn] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	if report != "" {
		s.cfg.Logf("%s", report)
	}
	go func() {
		defer s.wg.Done()
		defer func() {
			s.mu.Lock()
			delete(s.conns, cn)
			if cn.evicted.Load() {
				s.evicting--
			}
			s.mu.Unlock()
		}()
		if err := s.authorize(cred); err != nil {
			s.refused.Add(1)
			s.cfg.Logf("control: refused peer: %v", err)
			writeRefusal(c, err)
			return
		}
		s.accepted.Add(1)
		s.active.Add(1)
		defer s.active.Add(-1)
		cn.serve()
	}()
}

// writeRefusal sends e as an ERROR with sequence number 0, within a
// second, and closes c.
func writeRefusal(c *net.UnixConn, e *wire.Error) {
	defer c.Close()
	b := wire.NewBuilder(wire.Version, wire.MsgError, wire.FlagReply, 0)
	wire.PutError(b, e)
	if msg, err := b.Bytes(); err == nil {
		c.SetWriteDeadline(time.Now().Add(time.Second))
		c.Write(msg)
	}
}

// refuse sends e as an ERROR with sequence number 0 and closes c, without
// holding up the accept loop.
func (s *Server) refuse(c *net.UnixConn, e *wire.Error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		c.Close()
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		writeRefusal(c, e)
	}()
}

// peerCred reads the peer's credentials with SO_PEERCRED.
func peerCred(c *net.UnixConn) (unix.Ucred, *wire.Error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return unix.Ucred{}, wire.Errorf(wire.EACCES, "permission denied: cannot read peer credentials: %v", err)
	}
	var cred *unix.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return unix.Ucred{}, wire.Errorf(wire.EACCES, "permission denied: cannot read peer credentials: %v", errors.Join(err, cerr))
	}
	return *cred, nil
}

// authorize checks the peer's credentials: root, or the configured group
// as the peer's gid or among its uid's supplementary groups.
func (s *Server) authorize(cred unix.Ucred) *wire.Error {
	if cred.Uid == 0 {
		return nil
	}
	s.mu.Lock()
	isMember := s.isMember
	s.mu.Unlock()
	if s.gid >= 0 && (cred.Gid == uint32(s.gid) || isMember(cred.Uid, uint32(s.gid))) {
		return nil
	}
	if s.gid >= 0 {
		return wire.Errorf(wire.EACCES, "permission denied: peer pid %d uid %d gid %d is neither root nor in group %s (gid %d)",
			cred.Pid, cred.Uid, cred.Gid, s.cfg.Group, s.gid)
	}
	return wire.Errorf(wire.EACCES, "permission denied: peer pid %d uid %d gid %d is not root", cred.Pid, cred.Uid, cred.Gid)
}

// Close stops accepting, closes every connection (ending their event
// subscriptions) and waits for their goroutines. The socket file is
// removed.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	err := s.ln.Close()
	for c := range s.conns {
		c.nc.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}
