package testbed

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// DefaultMTU is the MTU of every link unless Options says otherwise.
const DefaultMTU = 1500

// DefaultPrefix starts the name of every namespace the package creates.
const DefaultPrefix = "etb"

// Options configure New.
type Options struct {
	// Prefix starts every namespace name; DefaultPrefix if empty. Names
	// are <Prefix>-<role>-<pid>-<n>.
	Prefix string
	// LANMTU is the MTU of the two LAN links, TransitMTU that of the
	// transit link; 0 means DefaultMTU.
	LANMTU, TransitMTU int
	// RouteLANs adds routes between the LANs over the transit link in the
	// gateways, for a plain-routing baseline. Without it nothing but a
	// tunnel connects the LANs.
	RouteLANs bool
	// Logf, if set, receives one line per step (for test logs).
	Logf func(format string, args ...any)
}

// Topology is a line client - gwA - gwB - server of network namespaces.
type Topology struct {
	Client, GwA, GwB, Server *Node
	// Opts are the options it was built with, defaults filled in.
	Opts Options

	closeOnce sync.Once
	closeErr  error
}

var nameSeq atomic.Uint32

// New builds the topology. On error it removes what it had created.
func New(opts Options) (*Topology, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.LANMTU == 0 {
		opts.LANMTU = DefaultMTU
	}
	if opts.TransitMTU == 0 {
		opts.TransitMTU = DefaultMTU
	}
	for _, m := range []int{opts.LANMTU, opts.TransitMTU} {
		if m < 1280 || m > 65535 {
			return nil, fmt.Errorf("testbed: MTU %d out of range 1280..65535 (IPv6 needs 1280)", m)
		}
	}
	t := &Topology{Opts: opts}
	register(t)
	if err := t.build(); err != nil {
		if cerr := t.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return nil, err
	}
	return t, nil
}

// NewT builds the topology for a test, fails the test if it cannot and skips
// it (with the reason) when the process may not create namespaces. Close
// runs in t.Cleanup, after the cleanups registered later (such as
// processes' log dumps).
func NewT(tb testing.TB, opts Options) *Topology {
	tb.Helper()
	if err := Available(); err != nil {
		tb.Skip(err)
	}
	if opts.Logf == nil {
		opts.Logf = tb.Logf
	}
	t, err := New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := t.Close(); err != nil {
			tb.Error(err)
		}
	})
	return t
}

// Nodes returns the namespaces in line order.
func (t *Topology) Nodes() []*Node {
	return []*Node{t.Client, t.GwA, t.GwB, t.Server}
}

func (t *Topology) logf(format string, args ...any) {
	if t.Opts.Logf != nil {
		t.Opts.Logf("testbed: "+format, args...)
	}
}

func (t *Topology) build() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pid := os.Getpid()
	n := nameSeq.Add(1)
	mk := func(role string) (*Node, error) {
		name := fmt.Sprintf("%s-%s-%d-%d", t.Opts.Prefix, strings.ToLower(role), pid, n)
		node, err := addNamespace(name)
		if err != nil {
			return nil, err
		}
		node.Role = role
		return node, nil
	}
	var err error
	if t.Client, err = mk("client"); err != nil {
		return err
	}
	if t.GwA, err = mk("gwA"); err != nil {
		return err
	}
	if t.GwB, err = mk("gwB"); err != nil {
		return err
	}
	if t.Server, err = mk("server"); err != nil {
		return err
	}
	t.logf("namespaces %s %s %s %s", t.Client.Name, t.GwA.Name, t.GwB.Name, t.Server.Name)

	for _, node := range t.Nodes() {
		// Before any link exists, so link-local addresses skip DAD too.
		for _, kv := range [][2]string{
			{"net/ipv6/conf/all/accept_dad", "0"},
			{"net/ipv6/conf/default/accept_dad", "0"},
			{"net/ipv6/conf/all/disable_ipv6", "0"},
			{"net/ipv6/conf/default/disable_ipv6", "0"},
		} {
			if err := node.Sysctl(kv[0], kv[1]); err != nil {
				return err
			}
		}
	}
	// Forwarding is set on every node, hosts too: a new namespace takes its
	// IPv4 settings from the machine's (net.core.devconf_inherit_init_net=0),
	// and a machine that routes must not make the client a router.
	for _, node := range t.Nodes() {
		forward := "0"
		if node == t.GwA || node == t.GwB {
			forward = "1"
		}
		for _, key := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
			if err := node.Sysctl(key, forward); err != nil {
				return err
			}
		}
	}

	links := []struct {
		a      *Node
		an     string
		b      *Node
		bn     string
		mtu    int
		aAddrs []netip.Prefix
		bAddrs []netip.Prefix
	}{
		{t.Client, IfHost, t.GwA, IfLAN, t.Opts.LANMTU,
			[]netip.Prefix{ClientV4, ClientV6}, []netip.Prefix{GwALANV4, GwALANV6}},
		{t.GwA, IfTransit, t.GwB, IfTransit, t.Opts.TransitMTU,
			[]netip.Prefix{GwATransitV4, GwATransitV6}, []netip.Prefix{GwBTransitV4, GwBTransitV6}},
		{t.GwB, IfLAN, t.Server, IfHost, t.Opts.LANMTU,
			[]netip.Prefix{GwBLANV4, GwBLANV6}, []netip.Prefix{ServerV4, ServerV6}},
	}
	for _, l := range links {
		if _, err := l.a.IP(ctx, "link", "add", l.an, "type", "veth", "peer", "name", l.bn, "netns", l.b.Name); err != nil {
			return err
		}
		for _, end := range []struct {
			n     *Node
			ifn   string
			addrs []netip.Prefix
		}{{l.a, l.an, l.aAddrs}, {l.b, l.bn, l.bAddrs}} {
			if _, err := end.n.IP(ctx, "link", "set", "dev", end.ifn, "mtu", fmt.Sprint(l.mtu), "up"); err != nil {
				return err
			}
			for _, p := range end.addrs {
				args := []string{"addr", "add", p.String(), "dev", end.ifn}
				if p.Addr().Is6() {
					args = append(args, "nodad")
				}
				if _, err := end.n.IP(ctx, args...); err != nil {
					return err
				}
			}
		}
		t.logf("link %s:%s <-> %s:%s mtu %d", l.a.Role, l.an, l.b.Role, l.bn, l.mtu)
	}

	routes := []struct {
		n    *Node
		args []string
	}{
		{t.Client, []string{"-4", "route", "add", "default", "via", GwALANV4.Addr().String()}},
		{t.Client, []string{"-6", "route", "add", "default", "via", GwALANV6.Addr().String()}},
		{t.Server, []string{"-4", "route", "add", "default", "via", GwBLANV4.Addr().String()}},
		{t.Server, []string{"-6", "route", "add", "default", "via", GwBLANV6.Addr().String()}},
	}
	if t.Opts.RouteLANs {
		routes = append(routes, []struct {
			n    *Node
			args []string
		}{
			{t.GwA, []string{"-4", "route", "add", LANBV4.String(), "via", GwBTransitV4.Addr().String()}},
			{t.GwA, []string{"-6", "route", "add", LANBV6.String(), "via", GwBTransitV6.Addr().String()}},
			{t.GwB, []string{"-4", "route", "add", LANAV4.String(), "via", GwATransitV4.Addr().String()}},
			{t.GwB, []string{"-6", "route", "add", LANAV6.String(), "via", GwATransitV6.Addr().String()}},
		}...)
	}
	for _, r := range routes {
		if _, err := r.n.IP(ctx, r.args...); err != nil {
			return err
		}
	}
	t.logf("routes installed (LANs routed over transit: %v)", t.Opts.RouteLANs)
	return nil
}

// Close stops every process started in the topology's namespaces and
// removes the namespaces. It is safe to call more than once and from
// several goroutines; later calls return the first call's result.
func (t *Topology) Close() error {
	t.closeOnce.Do(func() {
		defer unregister(t)
		var errs []error
		for _, n := range t.Nodes() {
			if n != nil {
				errs = append(errs, n.stopAll())
			}
		}
		for _, n := range t.Nodes() {
			if n != nil {
				errs = append(errs, deleteNamespace(n.Name))
			}
		}
		t.closeErr = errors.Join(errs...)
		t.logf("closed")
	})
	return t.closeErr
}
