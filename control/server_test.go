package control

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/espd/espd/control/wire"
)

// rawConn is a client that writes arbitrary bytes and reads messages.
type rawConn struct {
	t  *testing.T
	nc net.Conn
}

func rawDial(t *testing.T, path string) *rawConn {
	t.Helper()
	nc, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &rawConn{t: t, nc: nc}
}

func (r *rawConn) send(b []byte) {
	r.t.Helper()
	r.nc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := r.nc.Write(b); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

func (r *rawConn) read() (*wire.Message, error) {
	r.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	m, _, _, err := ReadMessage(r.nc, nil)
	return m, err
}

// wantError reads an ERROR with this sequence number and code and returns
// its message.
func (r *rawConn) wantError(seq uint32, code wire.Errno) *wire.Error {
	r.t.Helper()
	m, err := r.read()
	if err != nil {
		r.t.Fatalf("reading the ERROR (%v) reply: %v", code, err)
	}
	if m.Type != wire.MsgError || m.Flags&wire.FlagReply == 0 || m.Seq != seq {
		r.t.Fatalf("got %v flags %d seq %d, want ERROR seq %d", m.Type, m.Flags, m.Seq, seq)
	}
	e, err := wire.ReadError(m.Attrs)
	if err != nil {
		r.t.Fatal(err)
	}
	if e.Code != code {
		r.t.Fatalf("error %v, want %v", e, code)
	}
	return e
}

// wantEOF checks that the server closed the connection.
func (r *rawConn) wantEOF() {
	r.t.Helper()
	if m, err := r.read(); err == nil {
		r.t.Fatalf("connection still open: got %v", m.Type)
	} else if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		r.t.Fatalf("want EOF, got %v", err)
	}
}

// wantUsable checks that the connection still answers a HELLO.
func (r *rawConn) wantUsable(seq uint32) {
	r.t.Helper()
	r.send(encode(r.t, wire.MsgHello, 0, seq, func(b *wire.Builder) { b.U32(wire.AttrVersion, 1) }))
	m, err := r.read()
	if err != nil || m.Type != wire.MsgHello || m.Seq != seq {
		r.t.Fatalf("connection unusable: %v %v", m, err)
	}
}

func header(t wire.MsgType, version uint8, flags wire.Flags, length, seq uint32) []byte {
	b := make([]byte, wire.HeaderLen)
	binary.BigEndian.PutUint16(b, wire.Magic)
	b[2], b[3] = version, uint8(flags)
	binary.BigEndian.PutUint16(b[4:], uint16(t))
	binary.BigEndian.PutUint32(b[8:], length)
	binary.BigEndian.PutUint32(b[12:], seq)
	return b
}

// TestErrorReplies sends broken messages; each gets an ERROR, the
// connection stays usable when the framing allows, and another client is
// served all along.
func TestErrorReplies(t *testing.T) {
	ts := startServer(t, ServerConfig{MessageTimeout: 300 * time.Millisecond})
	other := dial(t, ts.path)
	ctx := testCtx(t)
	otherWorks := func() {
		t.Helper()
		if _, err := other.Stats(ctx); err != nil {
			t.Fatalf("other client: %v", err)
		}
	}

	// Errors after which the connection stays usable.
	stays := []struct {
		name string
		msg  []byte
		code wire.Errno
		want string
	}{
		{"unknown type", encode(t, 0x7777, 0, 10, nil), wire.EOPNOTSUPP, "unknown message type 0x7777"},
		{"reserved IKE type", encode(t, wire.MsgType(0x0043), 0, 11, func(b *wire.Builder) { b.Raw(1, []byte("ike")) }), wire.EOPNOTSUPP, "reserved for IKE"},
		{"server-only type", encode(t, wire.MsgEvent, 0, 12, nil), wire.EPROTO, "server only"},
		{"reply flag", encode(t, wire.MsgSAList, wire.FlagReply, 13, nil), wire.EPROTO, "reply flag"},
		{"garbage attributes", append(header(wire.MsgSAAdd, 1, 0, 24, 14), 0, 200, 0, 1, 9, 9, 9, 9), wire.EBADMSG, "overruns"},
		{"missing attribute", encode(t, wire.MsgSADel, 0, 15, func(b *wire.Builder) { b.U32(wire.AttrSPI, 1) }), wire.EINVAL, "missing required DST"},
		{"bad value", encode(t, wire.MsgSAAdd, 0, 16, func(b *wire.Builder) { b.U32(wire.AttrSPI, 1); b.Raw(wire.AttrDst, []byte{1, 2, 3}) }), wire.EBADMSG, "address of 3 bytes"},
		{"unsupported version", header(wire.MsgSAList, 9, 0, wire.HeaderLen, 17), wire.EPROTONOSUPPORT, "this server speaks 1"},
		{"hello without common version", encode(t, wire.MsgHello, 0, 18, func(b *wire.Builder) { b.U32(wire.AttrVersion, 2); b.U32(wire.AttrVersion, 3) }), wire.EPROTONOSUPPORT, "version 2, 3 not supported"},
		{"reserved header field", func() []byte { b := encode(t, wire.MsgSAList, 0, 19, nil); b[6] = 1; return b }(), wire.EBADMSG, "reserved"},
		{"unsubscribe without subscription", encode(t, wire.MsgUnsubscribe, 0, 20, nil), wire.ENOENT, "not subscribed"},
	}
	rc := rawDial(t, ts.path)
	for i, c := range stays {
		rc.send(c.msg)
		seq := binary.BigEndian.Uint32(c.msg[12:])
		e := rc.wantError(seq, c.code)
		if !strings.Contains(e.Msg, c.want) {
			t.Errorf("%s: message %q, want %q", c.name, e.Msg, c.want)
		}
		if c.code == wire.EPROTONOSUPPORT && (len(e.Versions) != 1 || e.Versions[0] != 1) {
			t.Errorf("%s: versions %v, want [1]", c.name, e.Versions)
		}
		rc.wantUsable(uint32(100 + i))
		otherWorks()
	}

	// An oversized message that can be skipped.
	rc.send(header(wire.MsgSAAdd, 1, 0, wire.MaxMessageSize+4096, 30))
	rc.send(make([]byte, wire.MaxMessageSize+4096-wire.HeaderLen))
	if e := rc.wantError(30, wire.EMSGSIZE); !strings.Contains(e.Msg, "exceeds the maximum") {
		t.Errorf("oversized: %q", e.Msg)
	}
	rc.wantUsable(31)
	otherWorks()

	// Errors that lose the framing: ERROR, then the connection closes.
	closes := []struct {
		name string
		msg  []byte
		seq  uint32
		code wire.Errno
	}{
		{"bad magic", append([]byte{0xde, 0xad}, make([]byte, 14)...), 0, wire.EBADMSG},
		{"misaligned length", header(wire.MsgSAList, 1, 0, 21, 40), 0, wire.EBADMSG},
		{"length below header", header(wire.MsgSAList, 1, 0, 4, 41), 0, wire.EBADMSG},
		{"far too large", header(wire.MsgSAAdd, 1, 0, 1<<30, 42), 42, wire.EMSGSIZE},
		{"truncated and stalled", header(wire.MsgSAList, 1, 0, 64, 43), 43, wire.ETIMEDOUT},
		{"stalled header", []byte{0xE5, 0xD0, 1}, 0, wire.ETIMEDOUT},
	}
	for _, c := range closes {
		rc := rawDial(t, ts.path)
		rc.send(c.msg)
		rc.wantError(c.seq, c.code)
		rc.wantEOF()
		otherWorks()
	}
	// A client that leaves in the middle of a message.
	rc = rawDial(t, ts.path)
	rc.send(header(wire.MsgSAList, 1, 0, 64, 50))
	rc.nc.Close()
	otherWorks()
}

func TestIdleTimeout(t *testing.T) {
	log := &logBuffer{}
	ts := startServer(t, ServerConfig{IdleTimeout: 200 * time.Millisecond, Logf: log.logf})
	rc := rawDial(t, ts.path)
	rc.wantUsable(1)
	e := rc.wantError(0, wire.ETIMEDOUT)
	if !strings.Contains(e.Msg, "idle") {
		t.Fatalf("idle: %q", e.Msg)
	}
	rc.wantEOF()
	// The server's log says which client it closed, and why.
	if l := log.matching(fmt.Sprintf("pid %d ", os.Getpid()), "idle for 200ms"); len(l) != 1 {
		t.Errorf("log lines about the idle close: %q, want one naming the client's pid", log.lines)
	}
	// A subscriber is exempt.
	c := dial(t, ts.path)
	if _, err := c.Subscribe(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if _, err := c.ListSAs(testCtx(t)); err != nil {
		t.Fatalf("subscriber disconnected while idle: %v", err)
	}
}

// TestMaxConns: at the limit a newcomer is admitted and the least recently
// active connection is closed; a Client on it learns why (EAGAIN).
func TestMaxConns(t *testing.T) {
	ts := startServer(t, ServerConfig{MaxConns: 2})
	c1 := dial(t, ts.path)
	c2 := dial(t, ts.path)
	if _, err := c2.Stats(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	c3 := dial(t, ts.path)
	if _, err := c3.Stats(testCtx(t)); err != nil {
		t.Fatalf("newcomer: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := c1.ListSAs(testCtx(t))
		var e *wire.Error
		if errors.As(err, &e) && e.Code == wire.EAGAIN && strings.Contains(e.Msg, "limit of 2 connections") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("oldest connection: %v, want EAGAIN", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := c2.Stats(testCtx(t)); err != nil {
		t.Fatalf("second connection: %v", err)
	}
	if st := ts.Stats(); st.Refused != 0 || st.Accepted != 3 || st.Evicted != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSocketFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	ts := startServer(t, ServerConfig{Path: filepath.Join(dir, "espd.sock")})
	checkMode := func(p string, mode os.FileMode, gid uint32) {
		t.Helper()
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode().Perm(), mode)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Gid != gid {
			t.Errorf("%s: gid %d, want %d", p, st.Gid, gid)
		}
	}
	checkMode(dir, 0o700, uint32(os.Getgid()))
	checkMode(ts.path, 0o600, uint32(os.Getgid()))
	// A second server on a live socket is refused.
	if _, err := Listen(dbBackend{ts.db}, ServerConfig{Path: ts.path}); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second server: %v", err)
	}
	// A non-socket file is not removed.
	plain := filepath.Join(t.TempDir(), "file")
	os.WriteFile(plain, nil, 0o600)
	if _, err := Listen(dbBackend{ts.db}, ServerConfig{Path: plain}); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("plain file: %v", err)
	}

	if os.Geteuid() != 0 {
		t.Log("not root: group ownership not checked")
		return
	}
	gdir := filepath.Join(t.TempDir(), "grp")
	gs := startServer(t, ServerConfig{Path: filepath.Join(gdir, "espd.sock"), Group: "4242"})
	checkMode(gdir, 0o750, 4242)
	checkMode(gs.path, 0o660, 4242)
	// A stale socket (no server behind it) is replaced.
	gs.Close()
	stale, err := net.ListenUnix("unix", &net.UnixAddr{Name: gs.path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close()
	if _, err := os.Stat(gs.path); err != nil {
		t.Fatal("stale socket missing")
	}
	s2, err := Listen(dbBackend{gs.db}, ServerConfig{Path: gs.path})
	if err != nil {
		t.Fatalf("over a stale socket: %v", err)
	}
	s2.Close()
}
