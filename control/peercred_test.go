package control

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/espd/espd/control/wire"
)

// peerChildEnv makes the test binary act as a control client: connect to
// the socket named, send HELLO, and print what came back.
const peerChildEnv = "ESPD_CONTROL_PEER_CHILD"

func TestMain(m *testing.M) {
	if path := os.Getenv(peerChildEnv); path != "" {
		fmt.Println(peerChild(path))
		os.Exit(0)
	}
	if spec := os.Getenv(floodChildEnv); spec != "" {
		os.Exit(floodChild(spec))
	}
	if path := os.Getenv(serverChildEnv); path != "" {
		os.Exit(serverChild(path))
	}
	os.Exit(m.Run())
}

// peerChild reports "uid U: HELLO" when the server answered the HELLO,
// "uid U: ERROR <code> <message>, EOF" when it refused and hung up, or
// what went wrong.
func peerChild(path string) string {
	out := fmt.Sprintf("uid %d gid %d: ", os.Getuid(), os.Getgid())
	nc, err := net.DialTimeout("unix", path, 5*time.Second)
	if err != nil {
		return out + "dial: " + err.Error()
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	b := wire.NewBuilder(wire.Version, wire.MsgHello, 0, 1)
	b.U32(wire.AttrVersion, uint32(wire.Version))
	msg, _ := b.Bytes()
	if _, err := nc.Write(msg); err != nil && !errors.Is(err, syscall.EPIPE) && !errors.Is(err, syscall.ECONNRESET) {
		return out + "write: " + err.Error()
	}
	m, _, _, err := ReadMessage(nc, nil)
	if err != nil {
		return out + "read: " + err.Error()
	}
	switch m.Type {
	case wire.MsgHello:
		return out + "HELLO"
	case wire.MsgError:
		e, err := wire.ReadError(m.Attrs)
		if err != nil {
			return out + "bad ERROR: " + err.Error()
		}
		out += fmt.Sprintf("ERROR %v %s", e.Code, e.Msg)
		if _, _, _, err := ReadMessage(nc, nil); errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) {
			out += ", EOF"
		} else {
			out += fmt.Sprintf(", then %v", err)
		}
		return out
	}
	return out + "unexpected " + m.Type.String()
}

// runPeer runs the test binary as uid/gid against the socket.
func runPeer(t *testing.T, bin, path string, uid, gid uint32) string {
	t.Helper()
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), peerChildEnv+"="+path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: []uint32{}}}
	cmd.Dir = "/"
	done := make(chan struct{})
	timer := time.AfterFunc(30*time.Second, func() {
		select {
		case <-done:
		default:
			cmd.Process.Kill()
		}
	})
	defer timer.Stop()
	out, err := cmd.CombinedOutput()
	close(done)
	if err != nil {
		t.Fatalf("child: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// peerBinary returns a directory that every user may traverse and a copy
// of the test binary in it that every user may execute.
func peerBinary(t *testing.T) (base, bin string) {
	t.Helper()
	base = t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(base, "peer.test")
	data, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return base, bin
}

// TestPeerCredentials runs clients as uid 65534: refused by SO_PEERCRED
// without a group, and with a group unless the peer's gid is that group.
// The socket is opened to everyone (mode 0666 in 0711 directories) so that
// the credential check, not the file mode, is what refuses.
func TestPeerCredentials(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root to run clients under other uids (CI runs as root)")
	}
	base, bin := peerBinary(t)

	rootOnly := startServer(t, ServerConfig{Path: filepath.Join(base, "a", "espd.sock")})
	withGroup := startServer(t, ServerConfig{Path: filepath.Join(base, "b", "espd.sock"), Group: "4243"})
	for _, ts := range []*testServer{rootOnly, withGroup} {
		os.Chmod(filepath.Dir(ts.path), 0o711)
		os.Chmod(ts.path, 0o666)
	}
	other := dial(t, rootOnly.path)

	out := runPeer(t, bin, rootOnly.path, 65534, 65534)
	if !strings.Contains(out, "ERROR EACCES") || !strings.Contains(out, "uid 65534") || !strings.HasSuffix(out, ", EOF") {
		t.Fatalf("root-only server, uid 65534: %s", out)
	}
	out = runPeer(t, bin, withGroup.path, 65534, 65534)
	if !strings.Contains(out, "ERROR EACCES") || !strings.Contains(out, "group 4243") || !strings.HasSuffix(out, ", EOF") {
		t.Fatalf("group server, uid 65534 gid 65534: %s", out)
	}
	out = runPeer(t, bin, withGroup.path, 65534, 4243)
	if !strings.HasSuffix(out, "HELLO") {
		t.Fatalf("group server, uid 65534 gid 4243: %s", out)
	}
	// Supplementary groups of the peer's uid count too.
	withGroup.mu.Lock()
	withGroup.isMember = func(uid, gid uint32) bool { return uid == 65534 && gid == 4243 }
	withGroup.mu.Unlock()
	out = runPeer(t, bin, withGroup.path, 65534, 65534)
	if !strings.HasSuffix(out, "HELLO") {
		t.Fatalf("group server, uid 65534 member of 4243: %s", out)
	}
	out = runPeer(t, bin, rootOnly.path, 0, 0)
	if !strings.HasSuffix(out, "HELLO") {
		t.Fatalf("root: %s", out)
	}
	if _, err := other.ListSAs(testCtx(t)); err != nil {
		t.Fatalf("root client after the refusals: %v", err)
	}
	if st := rootOnly.Stats(); st.Refused != 1 {
		t.Fatalf("refused %d, want 1", st.Refused)
	}
}
