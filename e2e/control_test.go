package e2e

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// The wire constants of docs/control-protocol.md, written out here so that
// the test checks the document, not the package that implements it.
const (
	ctlMagic      = 0xE5D0
	ctlVersion    = 1
	ctlHeaderLen  = 16
	ctlFlagReply  = 0x01
	ctlFlagMulti  = 0x02
	ctlMsgHello   = 0x0001
	ctlMsgError   = 0x0002
	ctlMsgDone    = 0x0003
	ctlMsgStats   = 0x0030
	ctlAttrErrNo  = 56
	ctlAttrErrMsg = 57
)

// ctlMsg is one message read from the control socket.
type ctlMsg struct {
	typ    uint16
	flags  uint8
	seq    uint32
	errno  syscall.Errno // ERROR's ERR_CODE
	errMsg string
}

func (m ctlMsg) String() string {
	if m.typ == ctlMsgError {
		return fmt.Sprintf("ERROR seq %d code %d (%v) %q", m.seq, int(m.errno), m.errno, m.errMsg)
	}
	return fmt.Sprintf("type 0x%04x flags 0x%02x seq %d", m.typ, m.flags, m.seq)
}

// header returns a message header.
func header(typ uint16, length, seq uint32) []byte {
	h := make([]byte, ctlHeaderLen)
	binary.BigEndian.PutUint16(h[0:], ctlMagic)
	h[2] = ctlVersion
	binary.BigEndian.PutUint16(h[4:], typ)
	binary.BigEndian.PutUint32(h[8:], length)
	binary.BigEndian.PutUint32(h[12:], seq)
	return h
}

// readMsg reads one message within 5 s.
func readMsg(c net.Conn) (ctlMsg, error) {
	var m ctlMsg
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	h := make([]byte, ctlHeaderLen)
	if _, err := io.ReadFull(c, h); err != nil {
		return m, err
	}
	if binary.BigEndian.Uint16(h) != ctlMagic {
		return m, fmt.Errorf("reply with magic 0x%04x", binary.BigEndian.Uint16(h))
	}
	m.typ = binary.BigEndian.Uint16(h[4:])
	m.flags = h[3]
	m.seq = binary.BigEndian.Uint32(h[12:])
	n := binary.BigEndian.Uint32(h[8:])
	if n < ctlHeaderLen || n > 1<<16 || n%4 != 0 {
		return m, fmt.Errorf("reply length %d", n)
	}
	body := make([]byte, n-ctlHeaderLen)
	if _, err := io.ReadFull(c, body); err != nil {
		return m, err
	}
	for len(body) >= 4 {
		al := int(binary.BigEndian.Uint16(body))
		at := binary.BigEndian.Uint16(body[2:])
		if al < 4 || al > len(body) {
			return m, fmt.Errorf("attribute length %d", al)
		}
		v := body[4:al]
		switch {
		case at == ctlAttrErrNo && len(v) == 4:
			m.errno = syscall.Errno(binary.BigEndian.Uint32(v))
		case at == ctlAttrErrMsg:
			m.errMsg = string(v)
		}
		body = body[min(len(body), (al+3)&^3):]
	}
	return m, nil
}

// expectError reads one message and requires it to be an ERROR with code
// and sequence number seq.
func expectError(t *testing.T, c net.Conn, what string, code syscall.Errno, seq uint32) {
	t.Helper()
	m, err := readMsg(c)
	if err != nil {
		t.Fatalf("%s: no reply: %v", what, err)
	}
	if m.typ != ctlMsgError || m.errno != code || m.seq != seq || m.flags&ctlFlagReply == 0 {
		t.Fatalf("%s: got %v, want ERROR %d (%v) with sequence %d", what, m, int(code), code, seq)
	}
	t.Logf("%s: %v", what, m)
}

// expectClosed requires the server to close the connection.
func expectClosed(t *testing.T, c net.Conn, what string) {
	t.Helper()
	m, err := readMsg(c)
	if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("%s: connection not closed: %v %v", what, m, err)
	}
}

// expectStats sends STATS with seq and requires a multi-part reply ending
// in DONE: the connection is still usable.
func expectStats(t *testing.T, c net.Conn, what string, seq uint32) {
	t.Helper()
	if _, err := c.Write(header(ctlMsgStats, ctlHeaderLen, seq)); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	for i := 0; i < 1000; i++ {
		m, err := readMsg(c)
		if err != nil {
			t.Fatalf("%s: STATS: %v", what, err)
		}
		if m.seq != seq || m.typ == ctlMsgError {
			t.Fatalf("%s: STATS got %v", what, m)
		}
		if m.typ == ctlMsgDone {
			return
		}
		if m.typ != ctlMsgStats || m.flags != ctlFlagReply|ctlFlagMulti {
			t.Fatalf("%s: STATS part %v", what, m)
		}
	}
	t.Fatalf("%s: STATS reply without DONE", what)
}

// TestControlSocket checks the control socket's defences: a client that is
// not root is refused, whether the socket's mode or the daemon stops it;
// garbage, unknown and oversized messages get the error replies
// docs/control-protocol.md specifies, and the connection is closed exactly
// when the framing is lost. The tunnel keeps forwarding throughout.
func TestControlSocket(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tn := newTunnel(t, tunnelOpts{inner: []testbed.Family{testbed.IPv4}})
	a := tn.a
	nobody := []string{"setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"}

	t.Run("non-root", func(t *testing.T) {
		out, err := runEspctl(nobody, a.sock, "sa", "flush")
		if err == nil {
			t.Fatalf("uid 65534 flushed the states:\n%s", out)
		}
		t.Logf("uid 65534, socket as espd made it: %v: %s", err, strings.TrimSpace(out))
		// Open the file system's door: the daemon itself must refuse.
		st, err := os.Stat(a.sock)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm()&0o077 != 0 {
			t.Errorf("control socket mode %v: others may connect", st.Mode().Perm())
		}
		for _, p := range []struct {
			path string
			mode os.FileMode
		}{{a.dir, 0o755}, {a.sock, 0o666}} {
			if err := os.Chmod(p.path, p.mode); err != nil {
				t.Fatal(err)
			}
		}
		defer os.Chmod(a.sock, st.Mode().Perm())
		defer os.Chmod(a.dir, 0o700)
		for _, args := range [][]string{{"sa", "flush"}, {"policy", "flush"}, {"sa", "list"}} {
			out, err := runEspctl(nobody, a.sock, args...)
			if err == nil {
				t.Errorf("uid 65534 ran %v through a world-writable socket:\n%s", args, out)
				continue
			}
			low := strings.ToLower(out)
			if !strings.Contains(low, "permission") && !strings.Contains(low, "eacces") &&
				!strings.Contains(low, "not authorized") && !strings.Contains(low, "denied") {
				t.Errorf("uid 65534 %v: refusal does not say why: %v: %s", args, err, out)
			}
			t.Logf("uid 65534 %v, socket mode 0666: %v: %s", args, err, strings.TrimSpace(out))
		}
		if got := a.spis(t); len(got) != 2 {
			t.Errorf("states after the refused flushes: %v", keys(got))
		}
		ping(t, ctx, tn.top, testbed.IPv4, false)
	})

	dial := func(t *testing.T) net.Conn {
		c, err := net.Dial("unix", a.sock)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	t.Run("garbage", func(t *testing.T) {
		c := dial(t)
		junk := make([]byte, 64)
		rand.Read(junk)
		copy(junk, "GARBAGE!")
		if _, err := c.Write(junk); err != nil {
			t.Fatal(err)
		}
		expectError(t, c, "bad magic", syscall.EBADMSG, 0)
		expectClosed(t, c, "bad magic")
	})

	t.Run("bad-length", func(t *testing.T) {
		c := dial(t)
		if _, err := c.Write(header(ctlMsgStats, 18, 3)); err != nil {
			t.Fatal(err)
		}
		expectError(t, c, "length 18", syscall.EBADMSG, 0)
		expectClosed(t, c, "length 18")
	})

	t.Run("unknown-type", func(t *testing.T) {
		c := dial(t)
		if _, err := c.Write(header(0x0777, ctlHeaderLen, 8)); err != nil {
			t.Fatal(err)
		}
		expectError(t, c, "type 0x0777", syscall.EOPNOTSUPP, 8)
		expectStats(t, c, "after an unknown type", 9)
	})

	t.Run("oversized", func(t *testing.T) {
		// 128 KiB, body sent: EMSGSIZE and the connection stays usable.
		c := dial(t)
		const size = 128 << 10
		msg := append(header(ctlMsgStats, size, 5), make([]byte, size-ctlHeaderLen)...)
		errc := make(chan error, 1)
		go func() { _, err := c.Write(msg); errc <- err }()
		expectError(t, c, "128 KiB message", syscall.EMSGSIZE, 5)
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		expectStats(t, c, "after a 128 KiB message", 6)

		// 2 MiB announced: EMSGSIZE and the connection is closed.
		c2 := dial(t)
		if _, err := c2.Write(header(ctlMsgStats, 2<<20, 7)); err != nil {
			t.Fatal(err)
		}
		expectError(t, c2, "2 MiB message", syscall.EMSGSIZE, 7)
		expectClosed(t, c2, "2 MiB message")
	})

	t.Run("truncated", func(t *testing.T) {
		// Half a header, then hang up: nothing to answer, nothing to break.
		c := dial(t)
		if _, err := c.Write(header(ctlMsgHello, ctlHeaderLen, 1)[:10]); err != nil {
			t.Fatal(err)
		}
		c.Close()
		expectStats(t, dial(t), "a fresh connection after a truncated one", 1)
	})

	t.Run("large-first-message", func(t *testing.T) {
		// sa add with 200 selectors: a message of about 9 KiB, the first
		// above 4 KiB on its connection.
		s := saSpec{spi: 0x7777, dir: "in", src: tn.bOuter, dst: tn.aOuter, suite: "aes128gcm16", encKey: randKey(t, 20), reqid: 77}
		args := s.args()
		defer removeKeyFiles(args)
		for i := range 200 {
			args = append(args, "--sel", fmt.Sprintf("src=198.19.%d.0/24,dst=198.18.%d.0/24,proto=udp,dport=%d", i, i, 2000+i))
		}
		a.mustCtl(t, args...)
		v, ok := a.ctlJSON(t, saGetArgs("get", 0x7777, tn.aOuter)...).(map[string]any)
		if !ok {
			t.Fatal("sa get: not an object")
		}
		if sels, _ := v["selectors"].([]any); len(sels) != 200 {
			t.Fatalf("state has %d selectors, want 200", len(sels))
		}
		a.mustCtl(t, saGetArgs("del", 0x7777, tn.aOuter)...)
	})

	t.Run("lockout", func(t *testing.T) {
		// espd's limit (64) of idle connections, each past its HELLO, then
		// espctl: it must get through, and espd must say that the limit bit.
		logBefore := len(a.proc.Log())
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for i := range 64 {
			c := dial(t)
			held = append(held, c)
			if _, err := c.Write(header(ctlMsgHello, ctlHeaderLen, uint32(i+1))); err != nil {
				t.Fatal(err)
			}
			if m, err := readMsg(c); err != nil || m.typ != ctlMsgHello {
				t.Fatalf("connection %d: %v %v", i, m, err)
			}
		}
		for i := range 3 {
			if out, err := a.ctl("sa", "list"); err != nil {
				t.Fatalf("espctl %d with 64 idle connections open: %v\n%s", i, err, out)
			}
		}
		if !eventually(5*time.Second, func() bool {
			return testbed.CountLines(a.proc.Log()[logBefore:], "connection limit of 64 reached", "closed the connection of pid") > 0
		}) {
			t.Errorf("no log line about the connection limit:\n%s", tail(a.proc.Log()[logBefore:], 20))
		}
		// The oldest idle connection was the one closed, with EAGAIN.
		if m, err := readMsg(held[0]); err != nil || m.typ != ctlMsgError || m.errno != syscall.EAGAIN {
			t.Errorf("oldest idle connection: %v %v, want an EAGAIN ERROR", m, err)
		}
	})

	// The daemon still forwards and still answers espctl.
	a.alive(t)
	if got := a.spis(t); len(got) != 2 {
		t.Errorf("states after the garbage: %v", keys(got))
	}
	ping(t, ctx, tn.top, testbed.IPv4, false)
	transfer(t, ctx, tn.top, testbed.IPv4, true, smallTransfer)
	transfer(t, ctx, tn.top, testbed.IPv4, false, smallTransfer)
	if a.logContains("panic") {
		t.Error("espd logged a panic")
	}
}
