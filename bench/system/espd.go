package system

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/espd/espd/control"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/sa"
	"github.com/espd/espd/testbed"
)

// SPIs and reqid of the tunnels the harness keys itself (espd, XFRM).
const (
	SPIAB uint32 = 0x0e5d1001 // gwA -> gwB
	SPIBA uint32 = 0x0e5d2001 // gwB -> gwA
	ReqID        = 1
	// EspdReplayWindow is the inbound replay window espd's states get.
	EspdReplayWindow = 128
)

// espdTUN is the TUN device of every espd the harness starts.
const espdTUN = "esp0"

// xdpDev is the interface the AF_XDP systems' espd receives raw ESP on
// (-xdp): each gateway's transit link, which testbed.New names IfTransit
// in gwA and in gwB alike.
const xdpDev = testbed.IfTransit

// Espd is espd on both gateways, keyed through its control socket with
// the Go client.
type Espd struct {
	name, label string
	godebug     string
	encap       bool
	baseline    bool   // runs Env.BaselineBin instead of Env.EspdBin
	xdp         string // if set, receives raw ESP through AF_XDP on xdpDev (-xdp) attached in this -xdp-mode

	top *testbed.Topology
	gw  [2]*espdProc
	a   addrs
	dir string
	env *Env
	// tunnels is how many tunnels KeyTunnels installed (tunnels.go).
	tunnels int
}

// NewEspd returns the espd system called name; godebug, if set, is the
// GODEBUG of the espd processes; encap selects ESP-in-UDP.
func NewEspd(name, label, godebug string, encap bool) *Espd {
	return &Espd{name: name, label: label, godebug: godebug, encap: encap}
}

// NewEspdXDP returns the raw-ESP espd system called name whose espd
// receives ESP on each gateway's transit link through AF_XDP (-xdp),
// attached in mode (-xdp-mode: auto, native or generic); godebug, if
// set, is the GODEBUG of the espd processes.
func NewEspdXDP(name, label, godebug, mode string) *Espd {
	return &Espd{name: name, label: label, godebug: godebug, xdp: mode}
}

// Name implements System.
func (e *Espd) Name() string { return e.name }

// Label implements System.
func (e *Espd) Label() string { return e.label }

// PerSuite implements System.
func (*Espd) PerSuite() bool { return true }

// Cipher implements System.
func (*Espd) Cipher() string { return "" }

// Available implements System: the harness builds espd itself.
func (e *Espd) Available(env *Env) error {
	if e.baseline && env.BaselineBin == "" {
		return &SkipError{Reason: "no baseline espd binary given", Enable: "-espd-baseline BIN"}
	}
	return nil
}

// NewEspdBaseline returns the espd system called name that runs the
// baseline binary (Env.BaselineBin), for before/after comparisons in one
// run.
func NewEspdBaseline(name, label string, encap bool) *Espd {
	return &Espd{name: name, label: label, encap: encap, baseline: true}
}

// bin returns the espd binary the system runs.
func (e *Espd) bin(env *Env) string {
	if e.baseline {
		return env.BaselineBin
	}
	return env.EspdBin
}

// flags returns the flags the system's espd gets on either gateway
// beyond espdArgv's own: env's (espdExtra) and, for the AF_XDP systems,
// -xdp naming the gateway's transit link.
func (e *Espd) flags(env *Env) []string {
	flags := env.espdExtra()
	if e.xdp != "" {
		flags = append(flags, "-xdp="+xdpDev, "-xdp-mode="+e.xdp)
	}
	return flags
}

// Setup implements System: a line with espd started on both gateways.
func (e *Espd) Setup(ctx context.Context, env *Env) error {
	var err error
	if e.dir, err = env.dir(e.name); err != nil {
		return err
	}
	e.env, e.a = env, addrsOf(env.Family)
	if e.top, err = newLine(env, false); err != nil {
		return err
	}
	for i, node := range []*testbed.Node{e.top.GwA, e.top.GwB} {
		p, err := startEspd(ctx, e.bin(env), node, e.dir, e.godebug, e.flags(env)...)
		if err != nil {
			return err
		}
		e.gw[i] = p
	}
	return nil
}

// espdProc is one running espd.
type espdProc struct {
	node *testbed.Node
	sock string
	proc *testbed.Process
}

// use runs f over a control connection of its own. The harness leaves one
// espd alone while the other systems run, often for longer than the control
// socket's idle timeout (a minute), after which espd closes a connection it
// was holding; a connection per operation has no idle time.
func (p *espdProc) use(ctx context.Context, f func(*control.Client) error) error {
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	c, err := control.Dial(dctx, p.sock)
	cancel()
	if err != nil {
		return fmt.Errorf("espd on %s: %w", p.node.Role, err)
	}
	defer c.Close()
	return f(c)
}

// espdSocket is the control socket of the espd in the gateway called
// role whose files are in dir.
func espdSocket(dir, role string) string { return filepath.Join(dir, "espd-"+role+".sock") }

// espdArgv returns the command line of espd (bin) in the gateway called
// role, its files in dir: the GODEBUG prefix (godebugEnv), the TUN, the
// control socket (espdSocket), the log level and the state directory,
// then extra.
func espdArgv(bin, dir, role, godebug string, extra ...string) []string {
	argv := append(godebugEnv(godebug), bin, "--tun", espdTUN, "--socket", espdSocket(dir, role), "--log-level", "warn",
		"--state-dir", filepath.Join(dir, "espd-"+role+".state"))
	return append(argv, extra...)
}

// startEspd starts espd in node (espdArgv) and connects to its control
// socket.
func startEspd(ctx context.Context, bin string, node *testbed.Node, dir, godebug string, extra ...string) (*espdProc, error) {
	p := &espdProc{node: node, sock: espdSocket(dir, node.Role)}
	argv := espdArgv(bin, dir, node.Role, godebug, extra...)
	var err error
	if p.proc, err = node.Start(filepath.Join(dir, "espd-"+node.Role+".log"), argv...); err != nil {
		return nil, err
	}
	err = waitFor(ctx, 20*time.Second, "espd on "+node.Role+" ready", func() (bool, error) {
		if done, werr := p.proc.Exited(); done {
			return false, fmt.Errorf("espd on %s exited: %v\n%s", node.Role, werr, lastLines(p.proc.Log(), 20))
		}
		c, err := net.DialTimeout("unix", p.sock, time.Second)
		if err != nil {
			return false, nil
		}
		c.Close()
		_, err = node.IP(ctx, "link", "show", "dev", espdTUN)
		return err == nil, nil
	})
	if err != nil {
		return p, err
	}
	return p, p.use(ctx, func(*control.Client) error { return nil })
}

func (p *espdProc) close() error {
	if p == nil {
		return nil
	}
	var errs []error
	if p.proc != nil {
		if err := p.proc.Stop(10 * time.Second); err != nil {
			errs = append(errs, fmt.Errorf("espd on %s: %w\n%s", p.node.Role, err, lastLines(p.proc.Log(), 10)))
		}
	}
	return errors.Join(errs...)
}

// keyEspd installs one gateway's side of the tunnel: its outbound and
// inbound states and the out and in policies between the LANs.
func keyEspd(ctx context.Context, c *control.Client, s crypto.Suite, local, remote addrs, outSPI, inSPI uint32, encap bool) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := errors.Join(c.FlushPolicies(ctx), c.FlushSAs(ctx)); err != nil {
		return err
	}
	for _, cfg := range []sa.Config{
		espdState(s, sa.DirOut, outSPI, local.gwA, remote.gwA, encap),
		espdState(s, sa.DirIn, inSPI, remote.gwA, local.gwA, encap),
	} {
		if err := c.AddSA(ctx, cfg); err != nil {
			return fmt.Errorf("add state 0x%08x: %w", cfg.SPI, err)
		}
	}
	for _, p := range []sa.Policy{
		{Selector: sa.Selector{Src: local.lanA, Dst: remote.lanA}, Dir: sa.DirOut, Action: sa.ActionProtect, ReqID: ReqID},
		{Selector: sa.Selector{Src: remote.lanA, Dst: local.lanA}, Dir: sa.DirIn, Action: sa.ActionProtect, ReqID: ReqID},
	} {
		if _, err := c.AddPolicy(ctx, p); err != nil {
			return fmt.Errorf("add policy %v -> %v %v: %w", p.Src, p.Dst, p.Dir, err)
		}
	}
	return nil
}

// espdState is the state with the given SPI from src to dst that the
// harness keys espd with: the suite's deterministic keys (SuiteKeys),
// reqid ReqID, an inbound state's replay window EspdReplayWindow, and, with
// encap, ESP-in-UDP on port 4500 both ways. It is a tunnel-mode state.
func espdState(s crypto.Suite, dir sa.Direction, spi uint32, src, dst netip.Addr, encap bool) sa.Config {
	cfg := sa.Config{SPI: spi, Dir: dir, Src: src, Dst: dst, Suite: s, ReqID: ReqID}
	cfg.EncKey, cfg.IntegKey = SuiteKeys(s, spi)
	if dir == sa.DirIn {
		cfg.ReplayWindow = EspdReplayWindow
	}
	if encap {
		cfg.EncapSrcPort, cfg.EncapDstPort = 4500, 4500
	}
	return cfg
}

// sides returns the addresses as gwA and as gwB see them: in each, gwA is
// the local gateway and lanA the local network.
func (a addrs) sides() (fromA, fromB addrs) {
	fromA = addrs{gwA: a.gwA, lanA: a.lanA}
	fromB = addrs{gwA: a.gwB, lanA: a.lanB}
	return fromA, fromB
}

// Key implements System: the same deterministic keys on both sides; a
// suite espd's crypto refuses is an *UnavailableError saying
// RefusedByEspd.
func (e *Espd) Key(ctx context.Context, s crypto.Suite) error {
	if err := refusedByEspd(s); err != nil {
		return err
	}
	a, b := e.a.sides()
	if err := e.gw[0].use(ctx, func(c *control.Client) error { return keyEspd(ctx, c, s, a, b, SPIAB, SPIBA, e.encap) }); err != nil {
		return fmt.Errorf("espd on gwA: %w", err)
	}
	if err := e.gw[1].use(ctx, func(c *control.Client) error { return keyEspd(ctx, c, s, b, a, SPIBA, SPIAB, e.encap) }); err != nil {
		return fmt.Errorf("espd on gwB: %w", err)
	}
	return nil
}

// Unkey implements System.
func (e *Espd) Unkey(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var errs []error
	for _, p := range e.gw {
		if p != nil && p.proc != nil {
			errs = append(errs, p.use(ctx, func(c *control.Client) error {
				return errors.Join(c.FlushPolicies(ctx), c.FlushSAs(ctx))
			}))
		}
	}
	return errors.Join(errs...)
}

// Topology implements System.
func (e *Espd) Topology() *testbed.Topology { return e.top }

// Gateways implements System.
func (e *Espd) Gateways() (a, b []int) { return espdPids(e.gw[0]), espdPids(e.gw[1]) }

func espdPids(p *espdProc) []int {
	if p == nil || p.proc == nil {
		return nil
	}
	return []int{p.proc.Pid()}
}

// Counters implements System: gwA's outbound state and gwB's inbound one.
func (e *Espd) Counters(ctx context.Context) (Counters, bool, error) {
	c, err := espdCounters(ctx, e.gw[0], e.gw[1], SPIAB, e.a.gwB)
	return c, true, err
}

// espdCounters reads the packets of state spi (destination dst) on both
// daemons: outbound on a, inbound on b.
func espdCounters(ctx context.Context, a, b *espdProc, spi uint32, dst netip.Addr) (Counters, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var c Counters
	var sta, stb control.Stats
	err := a.use(ctx, func(c *control.Client) (err error) { sta, err = c.SAStats(ctx, spi, dst); return err })
	if err != nil {
		return c, fmt.Errorf("espd on gwA: %w", err)
	}
	err = b.use(ctx, func(c *control.Client) (err error) { stb, err = c.SAStats(ctx, spi, dst); return err })
	if err != nil {
		return c, fmt.Errorf("espd on gwB: %w", err)
	}
	if len(sta.SAs) != 1 || len(stb.SAs) != 1 {
		return c, fmt.Errorf("espd: %d and %d states with spi 0x%08x", len(sta.SAs), len(stb.SAs), spi)
	}
	c.OutPackets = sta.SAs[0].Stats.Packets
	c.InPackets = stb.SAs[0].Stats.Packets
	for _, d := range stb.SAs[0].Stats.Drops {
		c.InDrops += d
	}
	return c, nil
}

// Close implements System.
func (e *Espd) Close() error {
	errs := []error{e.gw[1].close(), e.gw[0].close()}
	if e.top != nil {
		errs = append(errs, e.top.Close())
	}
	return errors.Join(errs...)
}

// godebugEnv returns the environment prefix for a GODEBUG setting.
func godebugEnv(godebug string) []string {
	if godebug == "" {
		return nil
	}
	return []string{"env", "GODEBUG=" + godebug}
}
