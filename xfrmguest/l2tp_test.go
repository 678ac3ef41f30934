package xfrmguest_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/internal/docblock"
	"github.com/espd/espd/testbed"
	"github.com/espd/espd/xfrmguest"
)

// l2tpDoc is the page whose "L2TP/IPsec" section TestL2TPIPsec runs.
const l2tpDoc = "../docs/strongswan.md"

// l2tpPluginEnv names a build of the charon plugin to test instead of the
// installed one, as strongswan/test takes it.
const (
	l2tpPluginEnv       = "ESPD_SS_PLUGIN"
	l2tpPluginInstalled = "/usr/lib/ipsec/plugins/libstrongswan-espd.so"
)

// The addresses of the section: the server's and the client's on the
// veth, and the two ends of the PPP link.
const (
	l2tpServer    = "198.18.0.1"
	l2tpClient    = "198.18.0.2"
	l2tpPPPServer = "198.18.100.1"
	l2tpPPPClient = "198.18.100.10"
)

// l2tpFile is one of the section's blocks and where it goes in its end's
// /etc.
type l2tpFile struct {
	role, lang, marker, path string
}

var l2tpFiles = []l2tpFile{
	{"server", "conf", "l2tp server swanctl.conf", "swanctl/conf.d/l2tp.conf"},
	{"server", "ini", "l2tp server xl2tpd.conf", "xl2tpd/xl2tpd.conf"},
	{"server", "text", "l2tp server options.xl2tpd", "ppp/options.xl2tpd"},
	{"server", "nft", "l2tp server firewall", "nftables.conf"},
	{"client", "conf", "l2tp client swanctl.conf", "swanctl/conf.d/l2tp.conf"},
	{"client", "ini", "l2tp client xl2tpd.conf", "xl2tpd/xl2tpd.conf"},
	{"client", "text", "l2tp client options.l2tpd.client", "ppp/options.l2tpd.client"},
}

// l2tpCharonConf is each end's strongswan.conf: the server's charon takes
// espd as its IPsec backend with the IKE hand-off (section
// "strongswan.conf"), the client's is a plain charon with the kernel's
// XFRM.
var l2tpCharonConf = map[string]string{
	"server": `charon {
  load = random nonce openssl aes sha1 sha2 hmac gcm kdf pem pkcs1 x509 pubkey revocation constraints vici espd kernel-netlink
  install_routes = no
  filelog {
    stderr {
      time_format = %T
      default = 1
      knl = 2
    }
  }
  plugins {
    espd {
      socket = /run/espd/espd.sock
      ike_handoff = yes
    }
  }
}
swanctl {
  load = pem pkcs1 x509 pubkey openssl random
}
`,
	"client": `charon {
  load = random nonce openssl aes sha1 sha2 hmac gcm kdf pem pkcs1 x509 pubkey revocation constraints vici kernel-netlink socket-default
  filelog {
    stderr {
      time_format = %T
      default = 1
      knl = 2
    }
  }
}
swanctl {
  load = pem pkcs1 x509 pubkey openssl random
}
`,
}

// l2tpLab is the guest's side of the lab, /mnt/host/lab.sh: "setup" makes
// the two namespaces on a veth and, for each end, a mount namespace with a
// private /run and the end's own /etc/{strongswan.conf,swanctl,xl2tpd,ppp}
// (copies of the root's with the test's files over them, bound in place);
// "in END CMD..." runs a command at that end (its network and mount
// namespaces); "start END NAME CMD..." starts a daemon there, its output in
// /mnt/host/logs/END-NAME.log; "wait-for PATH" waits (bounded) for a file.
const l2tpLab = `#!/bin/bash
set -euo pipefail
H=/mnt/host
case $1 in
setup)
  modprobe -a veth ppp_generic ppp_async ppp_synctty n_hdlc l2tp_ppp l2tp_netlink \
    xfrm_user esp4 tun nf_tables
  install -m 0755 "$H/bin/espd" "$H/bin/espctl" /usr/local/sbin/
  install -m 0644 "$H/bin/libstrongswan-espd.so" /usr/lib/ipsec/plugins/
  mkdir -p "$H/logs" /run/l2tp
  # pppd logs to syslog only.
  busybox syslogd -O "$H/logs/syslog.log"
  mount --bind /run/l2tp /run/l2tp
  mount --make-private /run/l2tp
  ip netns add server
  ip netns add client
  ip link add l2s netns server type veth peer name l2c netns client
  ip -n server addr add 198.18.0.1/24 dev l2s
  ip -n client addr add 198.18.0.2/24 dev l2c
  for r in server client; do
    ip -n $r link set lo up
    ip netns exec $r sysctl -qw net.ipv6.conf.all.disable_ipv6=1
  done
  ip -n server link set l2s up
  ip -n client link set l2c up
  for r in server client; do
    mkdir -p /l2tp/$r/etc
    cp -a /etc/ppp /etc/swanctl /etc/xl2tpd /etc/strongswan.conf /l2tp/$r/etc/
    cp -r "$H/$r/etc/." /l2tp/$r/etc/
    touch /run/l2tp/$r.mnt
    nsenter --net=/run/netns/$r unshare --mount=/run/l2tp/$r.mnt --propagation private sh -ec \
      "mount -t tmpfs -o mode=0755 tmpfs /run; mkdir -p /run/xl2tpd /run/espd
       for x in ppp swanctl xl2tpd strongswan.conf; do mount --bind /l2tp/$r/etc/\$x /etc/\$x; done"
  done
  ;;
in)
  r=$2
  shift 2
  exec nsenter --net=/run/netns/$r --mount=/run/l2tp/$r.mnt -- "$@"
  ;;
start)
  r=$2 name=$3
  shift 3
  nsenter --net=/run/netns/$r --mount=/run/l2tp/$r.mnt -- setsid "$@" >"$H/logs/$r-$name.log" 2>&1 </dev/null &
  echo $! >/run/l2tp/$r-$name.pid
  ;;
wait-for)
  r=$2 path=$3
  for i in $(seq 300); do
    if nsenter --net=/run/netns/$r --mount=/run/l2tp/$r.mnt -- test -e "$path"; then exit 0; fi
    sleep 0.1
  done
  echo "no $path at $r after 30 s" >&2
  exit 1
  ;;
esac
`

// TestL2TPIPsec runs docs/strongswan.md's "L2TP/IPsec" section as written:
// an L2TP/IPsec connection (IKEv1, ESP in transport mode for UDP 1701,
// xl2tpd and pppd on both ends, MS-CHAPv2) comes up through espd on the
// server and carries pings both ways over the PPP link. This machine's
// kernel has neither PPP nor L2TP, so it runs in a qemu guest with Debian
// 12's kernel and a Debian 12 root file system (l2tp-rootfs.sh), on a veth
// between two network namespaces: the server (espd and charon with the
// espd plugin of this checkout, the IKE hand-off, xl2tpd as LNS, the
// section's firewall) and the client (charon with the kernel's XFRM, xl2tpd
// as LAC with pppd), each with its own /etc files and /run. It checks the
// PPP addresses of both ends, the pings, that espd holds the CHILD_SA's two
// states in transport mode with the SPIs charon negotiated and the client's
// kernel its two (ip xfrm state), while the server's kernel holds none,
// and that a capture of the veth, from
// before the first IKE packet to the end, shows only IKE, ESP and link
// housekeeping: no L2TP (UDP 1701), no PPP address.
//
// It needs qemu, debootstrap and the charon plugin (installed, as
// strongswan/build.sh does, or ESPD_SS_PLUGIN), and skips without them
// unless CI=true.
func TestL2TPIPsec(t *testing.T) {
	ci := os.Getenv("CI") == "true"
	need := func(err error) {
		t.Helper()
		if err == nil {
			return
		}
		if ci {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	need(xfrmguest.Available())
	need(testbed.Available())
	plugin := os.Getenv(l2tpPluginEnv)
	if plugin == "" {
		plugin = l2tpPluginInstalled
	}
	_, err := os.Stat(plugin)
	need(err)

	// The section's blocks, each into its end's /etc (in the share).
	share := t.TempDir()
	for _, f := range l2tpFiles {
		text, err := docblock.One(l2tpDoc, f.lang, f.marker)
		if err != nil {
			t.Fatal(err)
		}
		writeShare(t, share, filepath.Join(f.role, "etc", f.path), text)
	}
	// The pre-shared key: the server's secret block as written, its file
	// in both ends' conf.d (the client's a copy of the server's).
	secretBlock, err := docblock.One(l2tpDoc, "sh", "l2tp server swanctl.conf secret")
	if err != nil {
		t.Fatal(err)
	}
	secrets, _ := testbed.RunSecretBlock(t, secretBlock)
	// alice's password: the server's chap-secrets block as written, its
	// line in both ends' chap-secrets (the client's pppd takes it there).
	chapBlock, err := docblock.One(l2tpDoc, "sh", "l2tp server chap-secrets")
	if err != nil {
		t.Fatal(err)
	}
	chap := testbed.RunFileBlock(t, chapBlock)
	if !regexp.MustCompile(`^alice l2tp-server "[A-Za-z0-9+/=]{16}" \*\n$`).MatchString(chap) {
		t.Fatalf("the chap-secrets block wrote %q, want alice's line with a fresh password", chap)
	}
	for _, role := range []string{"server", "client"} {
		writeShare(t, share, filepath.Join(role, "etc", "swanctl/conf.d/l2tp-secret.conf"), secrets)
		writeShare(t, share, filepath.Join(role, "etc", "ppp/chap-secrets"), chap)
	}
	connect, err := docblock.One(l2tpDoc, "sh", "l2tp client connect")
	if err != nil {
		t.Fatal(err)
	}
	writeShare(t, share, "client-connect.sh", connect)
	for role, conf := range l2tpCharonConf {
		writeShare(t, share, filepath.Join(role, "etc", "strongswan.conf"), conf)
	}
	writeShare(t, share, "lab.sh", l2tpLab)
	for name, src := range map[string]string{"espd": espdBin, "espctl": espctlBin, "libstrongswan-espd.so": plugin} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		writeShare(t, share, filepath.Join("bin", name), string(b))
	}

	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	start := time.Now()
	img, err := xfrmguest.BuildRoot(ctx, "l2tp-rootfs.sh")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image %s (kernel %s) ready in %v", img.Dir, img.KernelVersion, time.Since(start).Round(time.Millisecond))
	node := testbed.NewNodeT(t, "l2tp")
	work := t.TempDir()
	g, err := xfrmguest.BootRoot(ctx, img, xfrmguest.RootOptions{Node: node, Share: share, WorkDir: work})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			logs, _ := filepath.Glob(filepath.Join(share, "logs", "*.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				t.Logf("%s:\n%s", filepath.Base(l), testbed.Tail(string(b), 60))
			}
			b, _ := os.ReadFile(g.Console)
			t.Logf("guest console:\n%s", testbed.Tail(string(b), 30))
		}
		if err := g.Close(); err != nil {
			t.Logf("stopping qemu: %v", err)
		}
	})
	t.Logf("guest (kernel %s, Debian 12) booted in %v", img.KernelVersion, g.BootTime.Round(time.Millisecond))

	run := func(timeout time.Duration, cmd string) string {
		t.Helper()
		c, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		out, err := g.MustRun(c, cmd)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	lab := "bash /mnt/host/lab.sh "
	run(2*time.Minute, lab+"setup")

	// The capture of the veth, at the client's end, from before anything
	// is sent on it.
	run(30*time.Second, lab+"start client tcpdump tcpdump -Z root -i l2c -n -U -s 512 -w /mnt/host/veth.pcap")
	run(30*time.Second, "for i in $(seq 300); do grep -q 'listening on' /mnt/host/logs/client-tcpdump.log && exit 0; sleep 0.1; done; exit 1")

	// The server: espd, charon with the plugin, the connection, the
	// firewall, xl2tpd.
	run(30*time.Second, lab+"start server espd espd --tun esp0 --socket /run/espd/espd.sock --ike-handoff --state-dir /var/lib/espd")
	run(40*time.Second, lab+"wait-for server /run/espd/espd.sock")
	run(30*time.Second, lab+"start server charon /usr/lib/ipsec/charon")
	run(40*time.Second, lab+"wait-for server /run/charon.vici")
	run(time.Minute, lab+"in server swanctl --load-all")
	run(30*time.Second, lab+"in server nft -f /etc/nftables.conf")
	run(30*time.Second, lab+"start server xl2tpd xl2tpd -D")
	// The client: charon with the kernel's XFRM, the connection, xl2tpd.
	run(30*time.Second, lab+"start client charon /usr/lib/ipsec/charon")
	run(40*time.Second, lab+"wait-for client /run/charon.vici")
	run(time.Minute, lab+"in client swanctl --load-all")
	run(30*time.Second, lab+"start client xl2tpd xl2tpd -D")
	run(40*time.Second, lab+"wait-for client /run/xl2tpd/l2tp-control")
	run(40*time.Second, lab+"wait-for server /run/xl2tpd/l2tp-control")

	// The section's connect commands, at the client.
	connected := time.Now()
	run(2*time.Minute, lab+"in client bash -e /mnt/host/client-connect.sh")
	var addrs map[string]string
	ok := testbed.Poll(90*time.Second, 500*time.Millisecond, func() bool {
		addrs = map[string]string{}
		for _, r := range []string{"server", "client"} {
			c, cancel := context.WithTimeout(ctx, 20*time.Second)
			out, _, err := g.Run(c, "ip -n "+r+" -o -4 addr show dev ppp0")
			cancel()
			if err != nil {
				return false
			}
			addrs[r] = out
		}
		return strings.Contains(addrs["client"], "inet "+l2tpPPPClient+" peer "+l2tpPPPServer+"/32") &&
			strings.Contains(addrs["server"], "inet "+l2tpPPPServer+" peer "+l2tpPPPClient+"/32")
	})
	if !ok {
		t.Fatalf("no PPP link with %s (client) and %s (server) within 90 s:\nclient: %s\nserver: %s",
			l2tpPPPClient, l2tpPPPServer, addrs["client"], addrs["server"])
	}
	inet := regexp.MustCompile(`inet \S+ peer \S+`)
	t.Logf("PPP link up %v after the connect commands: client %s, server %s", time.Since(connected).Round(time.Millisecond),
		inet.FindString(addrs["client"]), inet.FindString(addrs["server"]))

	// Pings over the PPP link, both ways.
	for _, p := range []struct{ from, to string }{{"client", l2tpPPPServer}, {"server", l2tpPPPClient}} {
		out := run(time.Minute, fmt.Sprintf("ip netns exec %s ping -c 3 -i 0.5 -W 5 -I ppp0 %s", p.from, p.to))
		if !strings.Contains(out, "3 packets transmitted, 3 received") {
			t.Errorf("ping from the %s to %s over ppp0:\n%s", p.from, p.to, out)
		}
	}

	// espd holds the CHILD_SA's two states, in transport mode between the
	// two addresses, with the SPIs charon negotiated; so does the client's
	// kernel.
	sas := run(time.Minute, lab+"in server swanctl --list-sas --raw")
	spis := regexp.MustCompile(`spi-in=([0-9a-f]{8}) spi-out=([0-9a-f]{8})`).FindStringSubmatch(sas)
	if spis == nil || !strings.Contains(sas, "mode=TRANSPORT") {
		t.Errorf("the server's charon has no transport-mode CHILD_SA:\n%s", sas)
	}
	list := run(time.Minute, lab+"in server espctl --socket /run/espd/espd.sock sa list")
	if n := strings.Count(list, "proto esp mode transport"); n != 2 {
		t.Errorf("espd holds %d transport-mode states, want 2:\n%s", n, list)
	}
	for _, want := range []string{"src " + l2tpServer + " dst " + l2tpClient, "src " + l2tpClient + " dst " + l2tpServer} {
		if !strings.Contains(list, want) {
			t.Errorf("espd has no state %s:\n%s", want, list)
		}
	}
	for _, spi := range spis[1:] {
		if !strings.Contains(list, "spi 0x"+spi+" ") {
			t.Errorf("espd has no state with charon's SPI %s:\n%s", spi, list)
		}
	}
	xfrm := run(time.Minute, "ip -n client xfrm state")
	if n := strings.Count(xfrm, "mode transport"); n != 2 {
		t.Errorf("the client's kernel holds %d transport-mode states, want 2:\n%s", n, xfrm)
	}
	// The server's kernel (the same, which has ESP) holds nothing: espd
	// does the server's ESP.
	if x := run(time.Minute, "ip -n server xfrm state; ip -n server xfrm policy"); strings.TrimSpace(x) != "" {
		t.Errorf("the server's kernel holds XFRM states or policies:\n%s", x)
	}

	// The capture: IKE and ESP only.
	run(30*time.Second, "kill -INT $(cat /run/l2tp/client-tcpdump.pid); for i in $(seq 100); do kill -0 $(cat /run/l2tp/client-tcpdump.pid) 2>/dev/null || exit 0; sleep 0.1; done; exit 1")
	if tl, _ := os.ReadFile(filepath.Join(share, "logs", "client-tcpdump.log")); !regexp.MustCompile(`(?m)^0 packets dropped by kernel`).Match(tl) {
		t.Errorf("the capture is incomplete:\n%s", tl)
	}
	frames, err := readPcap(filepath.Join(share, "veth.pcap"))
	if err != nil {
		t.Fatal(err)
	}
	counts := map[testbed.Class]int{}
	for i := range frames {
		f := &frames[i]
		counts[f.Class]++
		if f.Class == testbed.ClassOther || (f.Proto == 17 && (f.SrcPort == 1701 || f.DstPort == 1701)) {
			t.Errorf("in clear on the veth: %v", f)
		}
	}
	res := testbed.CaptureResult{Frames: frames}
	for _, f := range res.Leaks(netip.MustParseAddr(l2tpPPPServer), netip.MustParseAddr(l2tpPPPClient)) {
		t.Errorf("a PPP address in clear on the veth: %v", &f)
	}
	if counts[testbed.ClassIKE] == 0 || counts[testbed.ClassESP] < 10 {
		t.Errorf("the veth carried %v, want IKE and ESP (L2TP's control and PPP's negotiation and pings)", counts)
	}
	t.Logf("the veth carried %d frames: %v", len(frames), counts)
}

// writeShare writes text to rel under the share, making its directories.
func writeShare(t *testing.T, share, rel, text string) {
	t.Helper()
	p := filepath.Join(share, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// readPcap reads a capture file of Ethernet frames (tcpdump -w, link type
// 1, microsecond time stamps, either byte order) and returns its frames,
// IP ones parsed by testbed.ParseFrame, ARP as link housekeeping, any
// other as ClassOther.
func readPcap(path string) ([]testbed.Frame, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if len(b) < 24 {
		return nil, fmt.Errorf("%s: %d bytes, no pcap header", path, len(b))
	}
	var order binary.ByteOrder
	switch binary.LittleEndian.Uint32(b) {
	case 0xa1b2c3d4:
		order = binary.LittleEndian
	case 0xd4c3b2a1:
		order = binary.BigEndian
	default:
		return nil, fmt.Errorf("%s: not a pcap file (magic %x)", path, b[:4])
	}
	if lt := order.Uint32(b[20:]); lt != 1 {
		return nil, fmt.Errorf("%s: link type %d, want Ethernet (1)", path, lt)
	}
	var frames []testbed.Frame
	for off := 24; off < len(b); {
		if off+16 > len(b) {
			return nil, fmt.Errorf("%s: truncated record header at %d", path, off)
		}
		at := time.Unix(int64(order.Uint32(b[off:])), int64(order.Uint32(b[off+4:]))*1000)
		n := int(order.Uint32(b[off+8:]))
		off += 16
		if off+n > len(b) || n < 14 {
			return nil, fmt.Errorf("%s: truncated record of %d bytes at %d", path, n, off)
		}
		eth := b[off : off+n]
		off += n
		switch et := binary.BigEndian.Uint16(eth[12:]); et {
		case testbed.EtherTypeIPv4, testbed.EtherTypeIPv6:
			frames = append(frames, testbed.ParseFrame(eth[14:], at, false))
		case testbed.EtherTypeARP:
			frames = append(frames, testbed.Frame{Time: at, EtherType: et, Len: n - 14, Data: eth[14:], Class: testbed.ClassLink})
		default:
			frames = append(frames, testbed.Frame{Time: at, EtherType: et, Len: n - 14, Data: eth[14:]})
		}
	}
	return frames, nil
}
