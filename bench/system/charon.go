package system

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/espd/espd/control"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/testbed"
)

// Paths of Debian's strongSwan.
const (
	CharonBin       = "/usr/lib/ipsec/charon"
	CharonPluginDir = "/usr/lib/ipsec/plugins"
	// EspdPlugin is the charon plugin espd's strongSwan integration
	// installs (strongswan/ in this repository).
	EspdPlugin = CharonPluginDir + "/libstrongswan-espd.so"
)

// CharonKind selects what carries the ESP under charon.
type CharonKind int

// Charon data paths.
const (
	// CharonLibipsec is strongSwan's own userspace ESP: the
	// kernel-libipsec plugin, a TUN named ipsec0, ESP-in-UDP on 4500,
	// every packet through charon's threads.
	CharonLibipsec CharonKind = iota
	// CharonEspd is espd, keyed by charon through the espd plugin.
	CharonEspd
)

// Charon runs a charon on each gateway, in its own mount namespace with a
// private /run, negotiating IKEv2 with a pre-shared key; gwA initiates.
type Charon struct {
	kind    CharonKind
	noAESNI bool // libipsec without AES-NI, PCLMULQDQ and AVX2

	env  *Env
	top  *testbed.Topology
	a    addrs
	dir  string
	gw   [2]*charonProc
	espd [2]*espdProc
}

// NewCharon returns the charon system of the given kind.
func NewCharon(kind CharonKind) *Charon { return &Charon{kind: kind} }

// NewLibipsecNoAESNI returns kernel-libipsec as on a CPU without AES-NI,
// carry-less multiplication and AVX2: charon loads no aesni plugin and
// OpenSSL runs with those bits masked (OpenSSLNoAESNI).
func NewLibipsecNoAESNI() *Charon { return &Charon{kind: CharonLibipsec, noAESNI: true} }

// OpenSSLNoAESNI is the OPENSSL_ia32cap mask that turns off OpenSSL's
// AES-NI (bit 57) and PCLMULQDQ (bit 33) code, and in the second word AVX2
// (bit 5) and the AVX-512 bits that imply it (16, 17, 21, 30, 31), as
// NoAESNI does for Go. Masking AVX2 alone leaves OpenSSL's AVX-512
// ChaCha20 in place (measured: 1.8 GB/s either way; 0.8 with this mask).
const OpenSSLNoAESNI = "~0x200000200000000:~0xC0230020"

// Name implements System.
func (c *Charon) Name() string {
	if c.kind == CharonEspd {
		return "espd-charon"
	}
	if c.noAESNI {
		return "libipsec-noaesni"
	}
	return "libipsec"
}

// Label implements System.
func (c *Charon) Label() string {
	if c.kind == CharonEspd {
		return "espd keyed by charon"
	}
	if c.noAESNI {
		return "strongSwan kernel-libipsec, no AES-NI/AVX2"
	}
	return "strongSwan kernel-libipsec"
}

// PerSuite implements System.
func (*Charon) PerSuite() bool { return true }

// Cipher implements System.
func (*Charon) Cipher() string { return "" }

// charonPlugins are the plugins a test charon loads, besides the one that
// carries ESP: crypto (openssl does the ESP and IKE algorithms, aesni and
// gcm where libipsec picks them), IKE's PSK and key derivation, the
// kernel-netlink kernel-net (addresses, routes), the IKE socket and vici.
var charonPlugins = []string{"random", "nonce", "openssl", "aes", "aesni", "sha1", "sha2", "hmac", "gcm",
	"pem", "pkcs1", "x509", "pubkey", "kdf"}

// Available implements System.
func (c *Charon) Available(*Env) error {
	need := []struct{ path, pkg string }{
		{CharonBin, "apt-get install strongswan-charon"},
		{filepath.Join(CharonPluginDir, "libstrongswan-openssl.so"), "apt-get install libstrongswan-standard-plugins"},
		{filepath.Join(CharonPluginDir, "libstrongswan-kdf.so"), "apt-get install libstrongswan-standard-plugins"},
		{filepath.Join(CharonPluginDir, "libstrongswan-vici.so"), "apt-get install strongswan-swanctl"},
	}
	if c.kind == CharonLibipsec {
		need = append(need, struct{ path, pkg string }{filepath.Join(CharonPluginDir, "libstrongswan-kernel-libipsec.so"), "apt-get install libcharon-extra-plugins"})
	} else {
		need = append(need, struct{ path, pkg string }{EspdPlugin, "build and install the charon plugin in strongswan/"})
	}
	for _, n := range need {
		if _, err := os.Stat(n.path); err != nil {
			return &SkipError{Reason: n.path + " not installed", Enable: n.pkg}
		}
	}
	for _, tool := range []struct{ name, pkg string }{
		{"swanctl", "apt-get install strongswan-swanctl"},
		{"unshare", "apt-get install util-linux"},
		{"mount", "apt-get install mount"},
	} {
		if _, err := exec.LookPath(tool.name); err != nil {
			return &SkipError{Reason: tool.name + " not found", Enable: tool.pkg}
		}
	}
	return nil
}

// Setup implements System: the line; charon starts in Key, for each suite.
func (c *Charon) Setup(ctx context.Context, env *Env) error {
	var err error
	c.env, c.a = env, addrsOf(env.Family)
	if c.dir, err = env.dir(c.Name()); err != nil {
		return err
	}
	if c.top, err = newLine(env, false); err != nil {
		return err
	}
	if c.kind == CharonEspd {
		for i, node := range []*testbed.Node{c.top.GwA, c.top.GwB} {
			// charon's socket-default owns UDP 500 and 4500 (no IKE
			// hand-off), so espd's ESP-in-UDP port moves aside; the
			// gateways see no NAT and use raw ESP.
			p, err := startEspd(ctx, env.EspdBin, node, c.dir, "", append([]string{"--udp-port", "4501"}, env.espdExtra()...)...)
			if err != nil {
				return err
			}
			c.espd[i] = p
		}
	}
	return nil
}

// charonProc is one running charon.
type charonProc struct {
	node *testbed.Node
	dir  string
	uri  string
	proc *testbed.Process
}

// identities and PSK of the test connection.
const (
	charonPSK = "espd-bench test PSK, not a secret"
	ikeProp   = "aes128gcm16-prfsha256-ecp256"
)

func charonID(role string) string { return strings.ToLower(role) + ".bench.test" }

// Key implements System: start both charons for the suite and bring the
// CHILD_SA up from gwA.
func (c *Charon) Key(ctx context.Context, s crypto.Suite) error {
	if c.kind == CharonEspd {
		if err := refusedByEspd(s); err != nil {
			return err
		}
	}
	if err := c.Unkey(ctx); err != nil {
		return err
	}
	nodes := []*testbed.Node{c.top.GwA, c.top.GwB}
	for i, node := range nodes {
		local, remote := c.a.gwA, c.a.gwB
		lnet, rnet := c.a.lanA, c.a.lanB
		if i == 1 {
			local, remote, lnet, rnet = remote, local, rnet, lnet
		}
		p, err := c.startCharon(ctx, node, i)
		if err != nil {
			return err
		}
		c.gw[i] = p
		conf := fmt.Sprintf(swanctlConf, local, remote, ikeProp, charonID(node.Role), charonID(nodes[1-i].Role),
			lnet, rnet, SuiteName(s), charonID("gwA"), charonID("gwB"), charonPSK)
		path := filepath.Join(p.dir, "swanctl.conf")
		if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
			return err
		}
		if out, err := swanctl(ctx, 20*time.Second, p.uri, "--load-all", "--noprompt", "--file", path); err != nil {
			return fmt.Errorf("charon on %s: load: %w\n%s", node.Role, err, out)
		}
	}
	if out, err := swanctl(ctx, 40*time.Second, c.gw[0].uri, "--initiate", "--child", "bench", "--timeout", "30"); err != nil {
		return fmt.Errorf("charon: initiate %s: %w\n%s\ncharon on gwA:\n%s", SuiteName(s), err, lastLines(out, 15), lastLines(c.gw[0].log(), 15))
	}
	return nil
}

// swanctlConf is a site-to-site connection with a PSK.
const swanctlConf = `connections {
	bench {
		version = 2
		local_addrs = %s
		remote_addrs = %s
		proposals = %s
		local {
			auth = psk
			id = %s
		}
		remote {
			auth = psk
			id = %s
		}
		children {
			bench {
				local_ts = %s
				remote_ts = %s
				esp_proposals = %v
				mode = tunnel
				start_action = none
			}
		}
	}
}
secrets {
	ike-bench {
		id-a = %s
		id-b = %s
		secret = "%s"
	}
}
`

// startCharon writes a charon's strongswan.conf and starts it in its own
// mount namespace, with DIR/run bound over /run (charon's pid and lock
// files there are global, not per network namespace) and the vici socket
// outside /run, where swanctl in the host's namespace reaches it.
func (c *Charon) startCharon(ctx context.Context, node *testbed.Node, i int) (*charonProc, error) {
	dir := filepath.Join(c.dir, node.Role)
	run := filepath.Join(dir, "run")
	if err := os.MkdirAll(run, 0o700); err != nil {
		return nil, err
	}
	p := &charonProc{node: node, dir: dir, uri: "unix://" + filepath.Join(dir, "charon.vici")}
	os.Remove(filepath.Join(dir, "charon.vici"))
	var load []string
	for _, pl := range charonPlugins {
		if pl == "aesni" && c.noAESNI {
			continue
		}
		if _, err := os.Stat(filepath.Join(CharonPluginDir, "libstrongswan-"+pl+".so")); err == nil {
			load = append(load, pl)
		}
	}
	extra := ""
	if c.kind == CharonLibipsec {
		// Before kernel-netlink, so that it takes the IPsec role.
		load = append(load, "kernel-libipsec")
	} else {
		load = append(load, "espd")
		// Without IKE hand-off: charon's socket-default keeps the IKE
		// ports (marked to bypass espd), espd carries raw ESP, as on
		// gateways without NAT between them.
		extra = fmt.Sprintf("\t\tespd {\n\t\t\tsocket = unix://%s\n\t\t\tike_handoff = no\n\t\t}\n", c.espd[i].sock)
	}
	load = append(load, "kernel-netlink", "socket-default", "vici")
	// libipsec needs charon's routes (table 220) into its ipsec0 TUN;
	// espd routes its policies' destinations into its own TUN, and
	// charon's table 220 would take the traffic past it.
	routes := "yes"
	if c.kind == CharonEspd {
		routes = "no"
	}
	conf := fmt.Sprintf(strongswanConf, strings.Join(load, " "), routes, p.uri, extra, filepath.Join(dir, "charon.log"))
	confPath := filepath.Join(dir, "strongswan.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	env := "STRONGSWAN_CONF=" + confPath
	if c.noAESNI {
		env += " OPENSSL_ia32cap=" + OpenSSLNoAESNI
	}
	script := fmt.Sprintf("mount --bind %s /run && exec env %s %s", run, env, CharonBin)
	var err error
	p.proc, err = node.Start(filepath.Join(dir, "charon.out"), "unshare", "-m", "--propagation", "private", "sh", "-c", script)
	if err != nil {
		return nil, err
	}
	err = waitFor(ctx, 20*time.Second, "charon on "+node.Role+" ready", func() (bool, error) {
		if done, werr := p.proc.Exited(); done {
			return false, fmt.Errorf("charon on %s exited: %v\n%s", node.Role, werr, lastLines(p.log(), 20))
		}
		_, err := swanctl(ctx, 5*time.Second, p.uri, "--stats")
		return err == nil, nil
	})
	if err != nil {
		return p, err
	}
	return p, nil
}

// strongswanConf is a test charon's configuration: explicit plugins,
// vici on a private socket, a log file and nothing to syslog.
const strongswanConf = `charon {
	load_modular = no
	load = %s
	install_routes = %s
	install_virtual_ip = no
	plugins {
		vici {
			socket = %s
		}
%s	}
	filelog {
		bench {
			path = %s
			time_format = %%T
			default = 1
			ike_name = yes
		}
	}
	syslog {
		daemon {
			default = -1
		}
	}
}
`

func (p *charonProc) log() string {
	b, err := os.ReadFile(filepath.Join(p.dir, "charon.log"))
	if err != nil {
		return p.proc.Log()
	}
	return string(b) + p.proc.Log()
}

// swanctl runs swanctl against a charon's vici socket.
func swanctl(ctx context.Context, max time.Duration, uri string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, max)
	defer cancel()
	cmd := exec.CommandContext(ctx, "swanctl", append(args, "--uri", uri)...)
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Unkey implements System: stop both charons (which removes their routes
// and, with libipsec, the ipsec0 TUN).
func (c *Charon) Unkey(context.Context) error {
	var errs []error
	for i, p := range c.gw {
		if p != nil {
			if err := p.proc.Stop(10 * time.Second); err != nil {
				errs = append(errs, fmt.Errorf("charon on %s: %w", p.node.Role, err))
			}
			c.gw[i] = nil
		}
	}
	return errors.Join(errs...)
}

// Topology implements System.
func (c *Charon) Topology() *testbed.Topology { return c.top }

// Gateways implements System: charon (which, with libipsec, carries the
// ESP in its threads), plus espd when it does.
func (c *Charon) Gateways() (a, b []int) {
	pids := func(i int) []int {
		var out []int
		if c.gw[i] != nil {
			out = append(out, c.gw[i].proc.Pid())
		}
		return append(out, espdPids(c.espd[i])...)
	}
	return pids(0), pids(1)
}

// Counters implements System: espd's counters when espd carries the ESP.
// charon picks the SPIs, so the states are found by listing them.
func (c *Charon) Counters(ctx context.Context) (Counters, bool, error) {
	if c.kind != CharonEspd {
		return Counters{}, false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var cnt Counters
	for i, p := range c.espd {
		var st control.Stats
		err := p.use(ctx, func(c *control.Client) (err error) { st, err = c.Stats(ctx); return err })
		if err != nil {
			return cnt, true, err
		}
		for _, s := range st.SAs {
			switch {
			case i == 0 && s.Config.Dst == c.a.gwB:
				cnt.OutPackets += s.Stats.Packets
			case i == 1 && s.Config.Dst == c.a.gwB:
				cnt.InPackets += s.Stats.Packets
				for _, d := range s.Stats.Drops {
					cnt.InDrops += d
				}
			}
		}
	}
	return cnt, true, nil
}

// Close implements System.
func (c *Charon) Close() error {
	errs := []error{c.Unkey(context.Background()), c.espd[1].close(), c.espd[0].close()}
	if c.top != nil {
		errs = append(errs, c.top.Close())
	}
	return errors.Join(errs...)
}
