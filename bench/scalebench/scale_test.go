package scalebench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/espd/espd/bench/load"
	"github.com/espd/espd/control"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/sa"
	"github.com/espd/espd/testbed"
)

var (
	flagStates   = flag.Int("states", 10000, "extra states (and as many policies) per daemon")
	flagDuration = flag.Duration("tcp", 4*time.Second, "measured time of each TCP run")
	flagReps     = flag.Int("reps", 3, "runs of each configuration, alternating")
	flagEncap    = flag.Bool("encap", true, "ESP-in-UDP (false: raw ESP)")
	flagEspd     = flag.String("espd", "", "espd binary (default: go build ./cmd/espd)")
)

// gateway is one espd with its control connection.
type gateway struct {
	node *testbed.Node
	proc *testbed.Process
	ctl  *control.Client
	sock string
}

func buildEspd(b *testing.B, dir string) string {
	if *flagEspd != "" {
		return *flagEspd
	}
	bin := filepath.Join(dir, "espd")
	if err := testbed.GoBuild(bin, testbed.EspdPackage); err != nil {
		b.Fatal(err)
	}
	return bin
}

func startGateway(b *testing.B, bin, dir string, node *testbed.Node) *gateway {
	g := &gateway{node: node, sock: filepath.Join(dir, node.Role+".sock")}
	var err error
	g.proc, err = node.Start(filepath.Join(dir, node.Role+".log"), bin, "--tun", "esp0", "--socket", g.sock, "--log-level", "warn",
		"--state-dir", filepath.Join(dir, node.Role+".state"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { g.proc.Stop(10 * time.Second) })
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := net.Dial("unix", g.sock); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("espd on %s not ready:\n%s", node.Role, g.proc.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if g.ctl, err = control.Dial(ctx, g.sock); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { g.ctl.Close() })
	return g
}

// key returns the keys of a state: fixed test keys, distinct per SPI.
func key(s crypto.Suite, spi uint32) (enc, integ []byte) {
	enc = make([]byte, s.EncKeyLen())
	for i := range enc {
		enc[i] = byte(spi>>uint(8*(i%4))) ^ byte(i)
	}
	integ = make([]byte, s.IntegKeyLen())
	for i := range integ {
		integ[i] = byte(spi) ^ 0xa5 ^ byte(i)
	}
	return enc, integ
}

// tunnel installs one side of the measured tunnel between the LANs.
func tunnel(ctx context.Context, c *control.Client, s crypto.Suite, local, remote netip.Addr, lanL, lanR netip.Prefix, out, in uint32) error {
	for _, cfg := range []sa.Config{
		{SPI: out, Dir: sa.DirOut, Src: local, Dst: remote},
		{SPI: in, Dir: sa.DirIn, Src: remote, Dst: local, ReplayWindow: 128},
	} {
		cfg.Suite, cfg.ReqID = s, 1
		cfg.EncKey, cfg.IntegKey = key(s, cfg.SPI)
		if *flagEncap {
			cfg.EncapSrcPort, cfg.EncapDstPort = 4500, 4500
		}
		if err := c.AddSA(ctx, cfg); err != nil {
			return err
		}
	}
	for _, p := range []sa.Policy{
		{Selector: sa.Selector{Src: lanL, Dst: lanR}, Dir: sa.DirOut, Action: sa.ActionProtect, ReqID: 1},
		{Selector: sa.Selector{Src: lanR, Dst: lanL}, Dir: sa.DirIn, Action: sa.ActionProtect, ReqID: 1},
	} {
		if _, err := c.AddPolicy(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// extra is the i-th extra state and policy: reqid 1000+i, SPI 0x10000+i,
// an outbound state to the peer and a policy for one host of
// 198.19.0.0/16, which no measured packet matches. Half of the states are
// inbound, so that both lookups hold thousands.
func extra(s crypto.Suite, local, remote netip.Addr, i int) (sa.Config, sa.Policy) {
	reqid := uint32(1000 + i)
	cfg := sa.Config{SPI: uint32(0x10000 + i), Suite: s, ReqID: reqid, Dir: sa.DirOut, Src: local, Dst: remote}
	pol := sa.Policy{Dir: sa.DirOut, Action: sa.ActionProtect, ReqID: reqid}
	host := netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
	pol.Selector = sa.Selector{Dst: netip.PrefixFrom(host, 32)}
	if i%2 == 1 {
		cfg.Dir, cfg.Src, cfg.Dst, cfg.ReplayWindow = sa.DirIn, remote, local, 128
		pol.Dir = sa.DirIn
		pol.Selector = sa.Selector{Src: netip.PrefixFrom(host, 32)}
	}
	cfg.EncKey, cfg.IntegKey = key(s, cfg.SPI)
	return cfg, pol
}

// install adds n extra states and policies and returns how long it took.
func install(ctx context.Context, c *control.Client, s crypto.Suite, local, remote netip.Addr, n int) (time.Duration, error) {
	start := time.Now()
	for i := range n {
		cfg, pol := extra(s, local, remote, i)
		if err := c.AddSA(ctx, cfg); err != nil {
			return 0, fmt.Errorf("state %d: %w", i, err)
		}
		if _, err := c.AddPolicy(ctx, pol); err != nil {
			return 0, fmt.Errorf("policy %d: %w", i, err)
		}
	}
	return time.Since(start), nil
}

// remove deletes them again.
func remove(ctx context.Context, c *control.Client, s crypto.Suite, local, remote netip.Addr, n int) error {
	for i := range n {
		cfg, pol := extra(s, local, remote, i)
		if err := errors.Join(c.DeleteSA(ctx, cfg.SPI, cfg.Dst), c.DeletePolicy(ctx, pol.ID())); err != nil {
			return fmt.Errorf("extra %d: %w", i, err)
		}
	}
	return nil
}

// BenchmarkManyStates reports install-s (seconds to install the extra
// states and policies through one control connection, per daemon),
// Mbit/s-1 and Mbit/s-many (median TCP goodput through the tunnel alone
// and with the extras installed, runs alternating) and many/1.
func BenchmarkManyStates(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	dir := b.TempDir()
	bin := buildEspd(b, dir)
	top := testbed.NewT(b, testbed.Options{Prefix: "escale"})
	ga, gb := startGateway(b, bin, dir, top.GwA), startGateway(b, bin, dir, top.GwB)
	suite, err := crypto.ParseSuite("aes128gcm16")
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	gwA, gwB := testbed.GwATransitV4.Addr(), testbed.GwBTransitV4.Addr()
	if err := errors.Join(
		tunnel(ctx, ga.ctl, suite, gwA, gwB, testbed.LANAV4, testbed.LANBV4, 0x1001, 0x2001),
		tunnel(ctx, gb.ctl, suite, gwB, gwA, testbed.LANBV4, testbed.LANAV4, 0x2001, 0x1001),
	); err != nil {
		b.Fatal(err)
	}
	measure := func() float64 {
		r, err := load.TCP(ctx, load.TCPOptions{From: top.Client, To: top.Server, Dst: testbed.ServerV4.Addr(),
			Omit: 500 * time.Millisecond, Duration: *flagDuration})
		if err != nil {
			b.Fatal(err)
		}
		return r.Bitrate() / 1e6
	}
	measure() // warm up
	var one, many, inst []float64
	for range b.N {
		for range *flagReps {
			one = append(one, measure())
			for _, g := range []struct {
				gw            *gateway
				local, remote netip.Addr
			}{{ga, gwA, gwB}, {gb, gwB, gwA}} {
				d, err := install(ctx, g.gw.ctl, suite, g.local, g.remote, *flagStates)
				if err != nil {
					b.Fatal(err)
				}
				inst = append(inst, d.Seconds())
			}
			st, err := ga.ctl.Stats(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if st.Global.States != *flagStates+2 || st.Global.Policies != *flagStates+2 {
				b.Fatalf("gwA holds %d states and %d policies, want %d", st.Global.States, st.Global.Policies, *flagStates+2)
			}
			many = append(many, measure())
			for _, g := range []struct {
				gw            *gateway
				local, remote netip.Addr
			}{{ga, gwA, gwB}, {gb, gwB, gwA}} {
				if err := remove(ctx, g.gw.ctl, suite, g.local, g.remote, *flagStates); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	median := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	b.Logf("install s %v; Mbit/s one %v, many %v", inst, one, many)
	b.ReportMetric(median(inst), "install-s")
	m1, mn := median(one), median(many)
	b.ReportMetric(m1, "Mbit/s-1")
	b.ReportMetric(mn, "Mbit/s-many")
	b.ReportMetric(mn/m1, "many/1")
}
