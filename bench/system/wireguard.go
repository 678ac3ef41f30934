package system

import (
	"bufio"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/testbed"
	"golang.org/x/crypto/curve25519"
)

// WireGuardPort is the UDP port both wireguard-go instances listen on.
const WireGuardPort = 51820

// wireGuardSockDir is where wireguard-go puts its UAPI sockets (a
// filesystem path, shared by all network namespaces).
const wireGuardSockDir = "/var/run/wireguard"

// FindWireGuard returns the wireguard-go binary on PATH or in Go's bin
// directory, or "". "go install golang.zx2c4.com/wireguard@latest" names
// it wireguard, distributions wireguard-go; either must say it is
// wireguard-go when asked for its version.
func FindWireGuard() string {
	var dirs []string
	if gobin := os.Getenv("GOBIN"); gobin != "" {
		dirs = append(dirs, gobin)
	} else if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		for _, d := range filepath.SplitList(strings.TrimSpace(string(out))) {
			dirs = append(dirs, filepath.Join(d, "bin"))
		}
	}
	for _, name := range []string{"wireguard-go", "wireguard"} {
		cands := []string{}
		if p, err := exec.LookPath(name); err == nil {
			cands = append(cands, p)
		}
		for _, d := range dirs {
			cands = append(cands, filepath.Join(d, name))
		}
		for _, p := range cands {
			out, err := exec.Command(p, "--version").Output()
			if err == nil && strings.HasPrefix(string(out), "wireguard-go ") {
				return p
			}
		}
	}
	return ""
}

// WireGuard is wireguard-go on both gateways with its own protocol and
// cipher (ChaCha20-Poly1305), configured through its UAPI socket.
type WireGuard struct {
	name, label, godebug string

	top   *testbed.Topology
	procs [2]*testbed.Process
	ifs   [2]string
	// env, dir, and the spokes on gwB KeyTunnels starts (tunnels.go).
	env      *Env
	dir      string
	spokes   []*testbed.Process
	spokeIfs []string
}

// NewWireGuard returns the wireguard-go system called name; godebug, if
// set, is the GODEBUG of the wireguard-go processes.
func NewWireGuard(name, label, godebug string) *WireGuard {
	return &WireGuard{name: name, label: label, godebug: godebug}
}

// Name implements System.
func (w *WireGuard) Name() string { return w.name }

// Label implements System.
func (w *WireGuard) Label() string { return w.label }

// PerSuite implements System.
func (*WireGuard) PerSuite() bool { return false }

// Cipher implements System.
func (*WireGuard) Cipher() string { return "WireGuard, ChaCha20-Poly1305" }

// Available implements System.
func (*WireGuard) Available(env *Env) error {
	if env.WireGuardBin == "" {
		return &SkipError{Reason: "wireguard-go not installed", Enable: "go install golang.zx2c4.com/wireguard@latest"}
	}
	return nil
}

// wgKey derives a gateway's private key and returns it with its public
// key.
func wgKey(role string) (priv, pub []byte, err error) {
	priv = TestKey("wireguard "+role, curve25519.ScalarSize)
	priv[0] &= 248
	priv[31] = priv[31]&127 | 64
	pub, err = curve25519.X25519(priv, curve25519.Basepoint)
	return priv, pub, err
}

// Setup implements System: wireguard-go on both gateways, peered over the
// transit link, with routes to the remote LAN through the interface.
func (w *WireGuard) Setup(ctx context.Context, env *Env) error {
	dir, err := env.dir(w.name)
	if err != nil {
		return err
	}
	a := addrsOf(env.Family)
	w.env, w.dir = env, dir
	if w.top, err = newLine(env, false); err != nil {
		return err
	}
	nodes := []*testbed.Node{w.top.GwA, w.top.GwB}
	tag := "p"
	if w.godebug != "" {
		tag = "n"
	}
	for i, node := range nodes {
		w.ifs[i] = fmt.Sprintf("wg%d%s%c", os.Getpid(), tag, 'a'+i)
		os.Remove(filepath.Join(wireGuardSockDir, w.ifs[i]+".sock"))
		argv := append(godebugEnv(w.godebug), env.WireGuardBin, "-f", w.ifs[i])
		if w.procs[i], err = node.Start(filepath.Join(dir, "wireguard-"+node.Role+".log"), argv...); err != nil {
			return err
		}
	}
	for i, node := range nodes {
		remote, rnet := a.gwB, a.lanB
		if i == 1 {
			remote, rnet = a.gwA, a.lanA
		}
		priv, _, err := wgKey(node.Role)
		if err != nil {
			return err
		}
		_, peerPub, err := wgKey(nodes[1-i].Role)
		if err != nil {
			return err
		}
		sock := filepath.Join(wireGuardSockDir, w.ifs[i]+".sock")
		if err := waitFor(ctx, 20*time.Second, "wireguard-go on "+node.Role+" ready", func() (bool, error) {
			if done, werr := w.procs[i].Exited(); done {
				return false, fmt.Errorf("wireguard-go on %s exited: %v\n%s", node.Role, werr, lastLines(w.procs[i].Log(), 20))
			}
			_, err := os.Stat(sock)
			return err == nil, nil
		}); err != nil {
			return err
		}
		cfg := fmt.Sprintf("set=1\nprivate_key=%s\nlisten_port=%d\nreplace_peers=true\npublic_key=%s\nendpoint=%s\nreplace_allowed_ips=true\nallowed_ip=%s\n\n",
			hex.EncodeToString(priv), WireGuardPort, hex.EncodeToString(peerPub),
			netip.AddrPortFrom(remote, WireGuardPort), rnet)
		if err := uapiSet(sock, cfg); err != nil {
			return fmt.Errorf("wireguard-go on %s: %w", node.Role, err)
		}
		if _, err := node.IP(ctx, "link", "set", "dev", w.ifs[i], "up"); err != nil {
			return err
		}
		if _, err := node.IP(ctx, "route", "add", rnet.String(), "dev", w.ifs[i]); err != nil {
			return err
		}
	}
	return nil
}

// uapiSet sends a set operation to a wireguard-go UAPI socket and checks
// its errno.
func uapiSet(sock, cfg string) error {
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(cfg)); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("UAPI reply: %w", err)
	}
	if strings.TrimSpace(line) != "errno=0" {
		return fmt.Errorf("UAPI set refused: %s", strings.TrimSpace(line))
	}
	return nil
}

// Key implements System: WireGuard has one cipher.
func (*WireGuard) Key(context.Context, crypto.Suite) error { return nil }

// Unkey implements System.
func (*WireGuard) Unkey(context.Context) error { return nil }

// Topology implements System.
func (w *WireGuard) Topology() *testbed.Topology { return w.top }

// Gateways implements System.
func (w *WireGuard) Gateways() (a, b []int) {
	pid := func(p *testbed.Process) []int {
		if p == nil {
			return nil
		}
		return []int{p.Pid()}
	}
	return pid(w.procs[0]), append(pid(w.procs[1]), w.spokePids()...)
}

// Counters implements System.
func (*WireGuard) Counters(context.Context) (Counters, bool, error) { return Counters{}, false, nil }

// Close implements System.
func (w *WireGuard) Close() error {
	errs := []error{w.stopSpokes(), stopAll(w.procs[:]...)}
	if w.top != nil {
		errs = append(errs, w.top.Close())
	}
	for _, name := range w.ifs {
		if name != "" {
			os.Remove(filepath.Join(wireGuardSockDir, name+".sock"))
		}
	}
	return errors.Join(errs...)
}
