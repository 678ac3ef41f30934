package system

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/testbed"
)

// wgSpokePort is the UDP port of spoke i on gwB: below the ephemeral
// range (32768 and up) that sockets bound to port 0 in gwB draw from (in
// that range, spoke 36 of 256 was once refused its port: EADDRINUSE).
func wgSpokePort(i int) int { return 20001 + i }

// KeyTunnels implements Tunnels for WireGuard, where a tunnel is a peer
// and a peer is a public key: gwA's interface becomes a hub with n peers,
// and gwB gets n spokes, each its own wireguard-go process and interface
// with its own key and port (one interface has one private key, so one
// gwB interface cannot be n peers of the hub). Peer i carries TunnelAddrs
// (i): the hub routes the server range into its interface and picks the
// peer by allowed_ip; gwB routes each client address into its spoke.
// gwB's CPU time is the sum over the spokes.
func (w *WireGuard) KeyTunnels(ctx context.Context, _ crypto.Suite, n int) error {
	if err := checkTunnels(n); err != nil {
		return err
	}
	if err := inotifyRoom(n); err != nil {
		return err
	}
	if err := w.stopSpokes(); err != nil {
		return err
	}
	err := w.keyTunnels(ctx, n)
	if err != nil {
		// A spoke that failed may have exited: Stop's complaint about
		// that adds nothing to err.
		_ = w.stopSpokes()
	}
	return err
}

// keyTunnels starts and configures n spokes and the hub.
func (w *WireGuard) keyTunnels(ctx context.Context, n int) error {
	f := w.env.Family
	a := addrsOf(f)
	hubPriv, hubPub, err := wgKey("gwA")
	if err != nil {
		return err
	}
	tag := "p"
	if w.godebug != "" {
		tag = "n"
	}
	var spokeRoutes []string
	for i := range n {
		name := fmt.Sprintf("wg%d%ss%d", os.Getpid(), tag, i)
		os.Remove(filepath.Join(wireGuardSockDir, name+".sock"))
		argv := append(godebugEnv(w.godebug), w.env.WireGuardBin, "-f", name)
		p, err := w.top.GwB.Start(filepath.Join(w.dir, fmt.Sprintf("wireguard-spoke%d.log", i)), argv...)
		if err != nil {
			return err
		}
		w.spokes = append(w.spokes, p)
		w.spokeIfs = append(w.spokeIfs, name)
	}
	var hub strings.Builder
	fmt.Fprintf(&hub, "set=1\nprivate_key=%x\nlisten_port=%d\nreplace_peers=true\n", hubPriv, WireGuardPort)
	for i, name := range w.spokeIfs {
		priv, pub, err := wgKey(fmt.Sprintf("spoke %d", i))
		if err != nil {
			return err
		}
		cAddr, sAddr := TunnelAddrs(f, i)
		sock := filepath.Join(wireGuardSockDir, name+".sock")
		p := w.spokes[i]
		if err := waitFor(ctx, 20*time.Second, "wireguard-go spoke "+name+" ready", func() (bool, error) {
			if done, werr := p.Exited(); done {
				return false, fmt.Errorf("wireguard-go spoke %s exited: %v\n%s", name, werr, lastLines(p.Log(), 20))
			}
			_, err := os.Stat(sock)
			return err == nil, nil
		}); err != nil {
			return err
		}
		cfg := fmt.Sprintf("set=1\nprivate_key=%x\nlisten_port=%d\nreplace_peers=true\npublic_key=%x\nendpoint=%s\nreplace_allowed_ips=true\nallowed_ip=%s\n\n",
			priv, wgSpokePort(i), hubPub, netip.AddrPortFrom(a.gwA, WireGuardPort), hostPrefix(cAddr))
		if err := uapiSet(sock, cfg); err != nil {
			return fmt.Errorf("wireguard-go spoke %d: %w", i, err)
		}
		spokeRoutes = append(spokeRoutes, "link set dev "+name+" up", fmt.Sprintf("route replace %s dev %s", hostPrefix(cAddr), name))
		fmt.Fprintf(&hub, "public_key=%x\nendpoint=%s\nreplace_allowed_ips=true\nallowed_ip=%s\n",
			pub, netip.AddrPortFrom(a.gwB, uint16(wgSpokePort(i))), hostPrefix(sAddr))
	}
	hub.WriteString("\n")
	if err := uapiSet(filepath.Join(wireGuardSockDir, w.ifs[0]+".sock"), hub.String()); err != nil {
		return fmt.Errorf("wireguard-go hub on gwA: %w", err)
	}
	if err := ipBatch(ctx, w.env, w.top.GwB, spokeRoutes); err != nil {
		return err
	}
	sRange := testbed.Pick(f, TunnelServerV4, TunnelServerV6)
	_, err = w.top.GwA.IP(ctx, "route", "replace", sRange.String(), "dev", w.ifs[0])
	return err
}

// inotifyPath is the limit of inotify instances per user, all
// namespaces together.
const inotifyPath = "/proc/sys/fs/inotify/max_user_instances"

// inotifyRoom returns an *UnavailableError if n more wireguard-go
// processes would not get their inotify instance: each watches its UAPI
// socket with one, and past the limit wireguard-go exits with "Failed to
// listen on uapi socket: too many open files". The margin leaves room for
// the hub, gwB's first interface and whatever else on the machine holds
// one.
func inotifyRoom(n int) error {
	const margin = 16
	b, err := os.ReadFile(inotifyPath)
	if err != nil {
		return nil // no such limit here
	}
	limit, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n+margin <= limit {
		return nil
	}
	return &UnavailableError{Reason: fmt.Sprintf("%d wireguard-go spokes need %d inotify instances (one each, for the UAPI socket) plus the hub's and others', and fs.inotify.max_user_instances is %d (raise it: sysctl -w fs.inotify.max_user_instances=%d)",
		n, n, limit, max(1024, 2*(n+margin)))}
}

// stopSpokes stops gwB's spokes (their interfaces and routes go with
// them).
func (w *WireGuard) stopSpokes() error {
	err := stopAll(w.spokes...)
	for _, name := range w.spokeIfs {
		os.Remove(filepath.Join(wireGuardSockDir, name+".sock"))
	}
	w.spokes, w.spokeIfs = nil, nil
	return err
}

// spokePids returns the spokes' pids.
func (w *WireGuard) spokePids() []int {
	var out []int
	for _, p := range w.spokes {
		out = append(out, p.Pid())
	}
	return out
}

// TunnelCounters implements Tunnels: the harness reads no wireguard-go
// counters.
func (*WireGuard) TunnelCounters(context.Context) ([]Counters, bool, error) { return nil, false, nil }
