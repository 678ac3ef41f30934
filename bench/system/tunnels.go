package system

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/espd/espd/bench/xfrm"
	"github.com/espd/espd/control"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/sa"
	"github.com/espd/espd/testbed"
)

// The inner addresses of the harness's many tunnels: tunnel i (from 0)
// owns block i of four addresses (/30, /126) in the client range and
// block i in the server range. The client holds the block's second
// address, the server likewise, each as a host (/32, /128) of its own on
// its LAN interface, and each tunnel's selector is that host pair. The
// block's first address is for the gateway on that side where a data path
// needs an address of its own inside the local selector (kernel-libipsec
// routes with one); its selector is then the block pair.
var (
	TunnelClientV4 = netip.MustParsePrefix("198.19.16.0/20")
	TunnelServerV4 = netip.MustParsePrefix("198.19.32.0/20")
	TunnelClientV6 = netip.MustParsePrefix("2001:db8:e5d1::/64")
	TunnelServerV6 = netip.MustParsePrefix("2001:db8:e5d2::/64")
)

// MaxTunnels is the most tunnels the harness configures: the IPv4 ranges
// hold 1024 blocks each, and wireguard-go's interface names fit in 15
// bytes up to 9999 spokes.
const MaxTunnels = 1000

// Every system the harness knows carries many tunnels.
var (
	_ Tunnels = (*Routing)(nil)
	_ Tunnels = (*Espd)(nil)
	_ Tunnels = (*XFRM)(nil)
	_ Tunnels = (*Charon)(nil)
	_ Tunnels = (*WireGuard)(nil)
)

// TunnelAddrs returns the client's and the server's inner address of
// tunnel i (from 0).
func TunnelAddrs(f testbed.Family, i int) (client, server netip.Addr) {
	c := testbed.Pick(f, TunnelClientV4, TunnelClientV6).Addr()
	s := testbed.Pick(f, TunnelServerV4, TunnelServerV6).Addr()
	return addrAdd(c, 4*i+2), addrAdd(s, 4*i+2)
}

// tunnelGateways returns gwA's and gwB's address in tunnel i's blocks.
func tunnelGateways(f testbed.Family, i int) (a, b netip.Addr) {
	c := testbed.Pick(f, TunnelClientV4, TunnelClientV6).Addr()
	s := testbed.Pick(f, TunnelServerV4, TunnelServerV6).Addr()
	return addrAdd(c, 4*i+1), addrAdd(s, 4*i+1)
}

// tunnelBlock returns the block (/30, /126) of a tunnel address.
func tunnelBlock(a netip.Addr) netip.Prefix {
	p, _ := a.Prefix(a.BitLen() - 2)
	return p
}

// Tunnels is a System that carries several tunnels at once (site pairs,
// each with its own SAs and policy, or its own WireGuard peer), between
// the inner addresses TunnelAddrs gives.
type Tunnels interface {
	System
	// KeyTunnels configures n tunnels for suite (ignored by systems with
	// their own cipher), replacing whatever Key or an earlier KeyTunnels
	// installed; Unkey removes them (systems that are not keyed per suite
	// remove them at the next KeyTunnels or at Close). An
	// *UnavailableError says why the system cannot carry n tunnels here.
	KeyTunnels(ctx context.Context, suite crypto.Suite, n int) error
	// TunnelCounters returns each tunnel's counters, in tunnel order, or
	// ok false if the system has none the harness reads.
	TunnelCounters(ctx context.Context) (c []Counters, ok bool, err error)
}

// addrAdd returns a + n (n small, no carry out of the last four bytes'
// range).
func addrAdd(a netip.Addr, n int) netip.Addr {
	b := a.AsSlice()
	carry := n
	for i := len(b) - 1; i >= 0 && carry > 0; i-- {
		v := int(b[i]) + carry
		b[i] = byte(v)
		carry = v >> 8
	}
	out, _ := netip.AddrFromSlice(b)
	return out
}

// hostPrefix is a as a single-address prefix.
func hostPrefix(a netip.Addr) netip.Prefix { return netip.PrefixFrom(a, a.BitLen()) }

// AddTunnelHosts gives the client and the server of a line the inner
// addresses of n tunnels, and gwA and gwB routes to them on their LAN
// side; the routes between the gateways are each system's own.
func AddTunnelHosts(ctx context.Context, env *Env, top *testbed.Topology, n int) error {
	if n < 1 || n > MaxTunnels {
		return fmt.Errorf("system: %d tunnels: 1 to %d", n, MaxTunnels)
	}
	f := env.Family
	var cl, sv []string
	for i := range n {
		c, s := TunnelAddrs(f, i)
		cl = append(cl, addrLine(hostPrefix(c)))
		sv = append(sv, addrLine(hostPrefix(s)))
	}
	cRange := testbed.Pick(f, TunnelClientV4, TunnelClientV6)
	sRange := testbed.Pick(f, TunnelServerV4, TunnelServerV6)
	client := testbed.Pick(f, testbed.ClientV4, testbed.ClientV6).Addr()
	server := testbed.Pick(f, testbed.ServerV4, testbed.ServerV6).Addr()
	for _, b := range []struct {
		node  *testbed.Node
		lines []string
	}{
		{top.Client, cl},
		{top.Server, sv},
		{top.GwA, []string{fmt.Sprintf("route replace %s via %s dev %s", cRange, client, testbed.IfLAN)}},
		{top.GwB, []string{fmt.Sprintf("route replace %s via %s dev %s", sRange, server, testbed.IfLAN)}},
	} {
		if err := ipBatch(ctx, env, b.node, b.lines); err != nil {
			return err
		}
	}
	return nil
}

func addrLine(p netip.Prefix) string {
	l := fmt.Sprintf("addr add %s dev %s", p, testbed.IfHost)
	if p.Addr().Is6() {
		l += " nodad"
	}
	return l
}

// ipBatch runs ip -batch in node with the given commands.
func ipBatch(ctx context.Context, env *Env, node *testbed.Node, lines []string) error {
	f, err := os.CreateTemp(env.Dir, "ip-batch-")
	if err != nil {
		return fmt.Errorf("system: %w", err)
	}
	defer os.Remove(f.Name())
	_, err = f.WriteString(strings.Join(lines, "\n") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("system: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	_, err = node.IP(ctx, "-batch", f.Name())
	return err
}

// TunnelSPIs returns the SPIs of tunnel i's states the harness keys itself
// (espd, XFRM): gwA -> gwB and gwB -> gwA. Its reqid is i+1.
func TunnelSPIs(i int) (ab, ba uint32) {
	return 0x0e5e0001 + uint32(i), 0x0e5f0001 + uint32(i)
}

// checkTunnels validates a tunnel count.
func checkTunnels(n int) error {
	if n < 1 || n > MaxTunnels {
		return &UnavailableError{Reason: fmt.Sprintf("%d tunnels: the harness configures 1 to %d", n, MaxTunnels)}
	}
	return nil
}

// KeyTunnels implements Tunnels: n state pairs and n policy pairs on each
// espd, tunnel i between TunnelAddrs(i) with reqid i+1.
func (e *Espd) KeyTunnels(ctx context.Context, s crypto.Suite, n int) error {
	if err := checkTunnels(n); err != nil {
		return err
	}
	e.tunnels = n
	for side, p := range e.gw {
		if err := keyEspdTunnels(ctx, p.ctl, s, e.env.Family, e.a, side == 1, n, e.encap); err != nil {
			return fmt.Errorf("espd on %s: %w", p.node.Role, err)
		}
	}
	return nil
}

// keyEspdTunnels installs one gateway's side of n tunnels (gwB's if
// atB).
func keyEspdTunnels(ctx context.Context, c *control.Client, s crypto.Suite, f testbed.Family, a addrs, atB bool, n int, encap bool) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second+time.Duration(n)*50*time.Millisecond)
	defer cancel()
	if err := errors.Join(c.FlushPolicies(ctx), c.FlushSAs(ctx)); err != nil {
		return err
	}
	for i := range n {
		ab, ba := TunnelSPIs(i)
		cAddr, sAddr := TunnelAddrs(f, i)
		local, remote, lnet, rnet, out, in := a.gwA, a.gwB, hostPrefix(cAddr), hostPrefix(sAddr), ab, ba
		if atB {
			local, remote, lnet, rnet, out, in = a.gwB, a.gwA, hostPrefix(sAddr), hostPrefix(cAddr), ba, ab
		}
		reqid := uint32(i + 1)
		for _, cfg := range []sa.Config{
			{SPI: out, Dir: sa.DirOut, Src: local, Dst: remote, Suite: s, ReqID: reqid},
			{SPI: in, Dir: sa.DirIn, Src: remote, Dst: local, Suite: s, ReqID: reqid, ReplayWindow: EspdReplayWindow},
		} {
			cfg.EncKey, cfg.IntegKey = SuiteKeys(s, cfg.SPI)
			if encap {
				cfg.EncapSrcPort, cfg.EncapDstPort = 4500, 4500
			}
			if err := c.AddSA(ctx, cfg); err != nil {
				return fmt.Errorf("add state 0x%08x: %w", cfg.SPI, err)
			}
		}
		for _, p := range []sa.Policy{
			{Selector: sa.Selector{Src: lnet, Dst: rnet}, Dir: sa.DirOut, Action: sa.ActionProtect, ReqID: reqid},
			{Selector: sa.Selector{Src: rnet, Dst: lnet}, Dir: sa.DirIn, Action: sa.ActionProtect, ReqID: reqid},
		} {
			if _, err := c.AddPolicy(ctx, p); err != nil {
				return fmt.Errorf("add policy %v -> %v %v: %w", p.Src, p.Dst, p.Dir, err)
			}
		}
	}
	return nil
}

// TunnelCounters implements Tunnels: per tunnel, gwA's outbound state and
// gwB's inbound one of the direction client -> server.
func (e *Espd) TunnelCounters(ctx context.Context) ([]Counters, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var per [2]map[uint32]sa.Stats
	for side, p := range e.gw {
		st, err := p.ctl.Stats(ctx)
		if err != nil {
			return nil, true, fmt.Errorf("espd on %s: %w", p.node.Role, err)
		}
		per[side] = map[uint32]sa.Stats{}
		for _, s := range st.SAs {
			per[side][s.Config.SPI] = s.Stats
		}
	}
	out := make([]Counters, e.tunnels)
	for i := range out {
		ab, _ := TunnelSPIs(i)
		sa, okA := per[0][ab]
		sb, okB := per[1][ab]
		if !okA || !okB {
			return nil, true, fmt.Errorf("espd: tunnel %d's state 0x%08x missing on gwA or gwB", i, ab)
		}
		out[i].OutPackets, out[i].InPackets = sa.Packets, sb.Packets
		for _, d := range sb.Drops {
			out[i].InDrops += d
		}
	}
	return out, true, nil
}

// KeyTunnels implements Tunnels: n state pairs and policy pairs in each
// gateway's kernel, and routes to the other side's tunnel addresses over
// the transit link (XFRM's output policy is looked up after the route).
func (x *XFRM) KeyTunnels(ctx context.Context, s crypto.Suite, n int) error {
	if err := checkTunnels(n); err != nil {
		return err
	}
	if err := x.Unkey(ctx); err != nil {
		return err
	}
	f := testbed.IPv4
	if x.a.gwA.Is6() {
		f = testbed.IPv6
	}
	cRange := testbed.Pick(f, TunnelClientV4, TunnelClientV6)
	sRange := testbed.Pick(f, TunnelServerV4, TunnelServerV6)
	for _, r := range []struct {
		node *testbed.Node
		dst  netip.Prefix
		via  netip.Addr
	}{{x.top.GwA, sRange, x.a.gwB}, {x.top.GwB, cRange, x.a.gwA}} {
		if _, err := r.node.IP(ctx, "route", "replace", r.dst.String(), "via", r.via.String(), "dev", testbed.IfTransit); err != nil {
			return err
		}
	}
	tunnels := make([][2]xfrm.Tunnel, n)
	for i := range n {
		ab, ba := TunnelSPIs(i)
		cAddr, sAddr := TunnelAddrs(f, i)
		ta := xfrm.Tunnel{Suite: s, Local: x.a.gwA, Remote: x.a.gwB, LocalNet: hostPrefix(cAddr), RemoteNet: hostPrefix(sAddr),
			OutSPI: ab, InSPI: ba, ReqID: i + 1, ReplayWindow: xfrm.MaxReplayWindow}
		ta.OutEncKey, ta.OutIntegKey = SuiteKeys(s, ab)
		ta.InEncKey, ta.InIntegKey = SuiteKeys(s, ba)
		tb := xfrm.Tunnel{Suite: s, Local: x.a.gwB, Remote: x.a.gwA, LocalNet: hostPrefix(sAddr), RemoteNet: hostPrefix(cAddr),
			OutSPI: ba, InSPI: ab, ReqID: i + 1, ReplayWindow: xfrm.MaxReplayWindow,
			OutEncKey: ta.InEncKey, OutIntegKey: ta.InIntegKey, InEncKey: ta.OutEncKey, InIntegKey: ta.OutIntegKey}
		tunnels[i] = [2]xfrm.Tunnel{ta, tb}
	}
	if err := x.install(ctx, s, tunnels); err != nil {
		return err
	}
	x.keyed = n
	return nil
}

// TunnelCounters implements Tunnels: per tunnel, gwA's outbound state and
// gwB's inbound one of the direction client -> server, as for espd.
func (x *XFRM) TunnelCounters(context.Context) ([]Counters, bool, error) {
	a, err := xfrm.ReadAllStats(xfrm.NodeHandle{Node: x.top.GwA})
	if err != nil {
		return nil, true, err
	}
	b, err := xfrm.ReadAllStats(xfrm.NodeHandle{Node: x.top.GwB})
	if err != nil {
		return nil, true, err
	}
	out := make([]Counters, x.keyed)
	for i := range out {
		ab, _ := TunnelSPIs(i)
		sa, okA := a[ab]
		sb, okB := b[ab]
		if !okA || !okB {
			return nil, true, fmt.Errorf("xfrm: tunnel %d's state 0x%08x missing on gwA or gwB", i, ab)
		}
		out[i] = Counters{OutPackets: sa.Packets, InPackets: sb.Packets, InDrops: sb.Drops}
	}
	return out, true, nil
}

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

// KeyTunnels implements Tunnels: the ceiling of many tunnels is many
// host pairs routed in the clear, so the gateways route the tunnel
// ranges over the transit link as they route the LANs.
func (r *Routing) KeyTunnels(ctx context.Context, _ crypto.Suite, n int) error {
	if err := checkTunnels(n); err != nil {
		return err
	}
	for _, rt := range []struct {
		node *testbed.Node
		dst  netip.Prefix
		via  netip.Prefix
	}{
		{r.top.GwA, TunnelServerV4, testbed.GwBTransitV4}, {r.top.GwA, TunnelServerV6, testbed.GwBTransitV6},
		{r.top.GwB, TunnelClientV4, testbed.GwATransitV4}, {r.top.GwB, TunnelClientV6, testbed.GwATransitV6},
	} {
		if _, err := rt.node.IP(ctx, "route", "replace", rt.dst.String(), "via", rt.via.Addr().String(), "dev", testbed.IfTransit); err != nil {
			return err
		}
	}
	return nil
}

// TunnelCounters implements Tunnels: routing has no counters.
func (*Routing) TunnelCounters(context.Context) ([]Counters, bool, error) { return nil, false, nil }
