package conn

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBindErrorNamesHolder: when the IKE hand-off or the encapsulation
// port cannot bind because a socket holds the port (another charon, in
// life), the error names the process that holds it: here the test
// process itself, with a socket in the same namespace. The IKE port's
// holder is an IPv6 socket that also takes IPv4 (not V6ONLY), found
// through /proc/net/udp6 while the IPv4 bind fails.
func TestBindErrorNamesHolder(t *testing.T) {
	a, _ := twoNS(t)
	b, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	me := fmt.Sprintf("pid %d (%s)", os.Getpid(), strings.TrimSpace(string(b)))

	hold := func(network, addr string) {
		t.Helper()
		var c net.PacketConn
		if err := a.Do(func() (err error) { c, err = net.ListenPacket(network, addr); return err }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	hold("udp4", "0.0.0.0:4502")
	err = a.Do(func() error {
		s, err := OpenSockets(SocketConfig{Mark: testMark, EncapPort: 4502, NoIPv6: true})
		if err == nil {
			s.Close()
		}
		return err
	})
	if err == nil || !strings.Contains(err.Error(), "address already in use") || !strings.Contains(err.Error(), "held by "+me) {
		t.Errorf("binding a held encapsulation port: %v; want it to say it is held by %s", err, me)
	}

	hold("udp", "[::]:502")
	s := openIn(t, a, SocketConfig{Mark: testMark, EncapPort: 4503})
	err = a.Do(func() error { return s.StartIKE(502, func(IKEPacket) {}) })
	if err == nil || !strings.Contains(err.Error(), "UDP port 502") || !strings.Contains(err.Error(), "held by "+me) {
		t.Errorf("starting the hand-off on a held port: %v; want it to say it is held by %s", err, me)
	}
	t.Log(err)
	if err != nil && strings.Contains(err.Error(), "charon") {
		t.Errorf("the error blames a charon for a port the test holds: %v", err)
	}
	if _, natt := s.IKEPorts(); natt != 4503 {
		t.Errorf("IKEPorts after a failed start: natt %d", natt)
	}
	if ike, _ := s.IKEPorts(); ike != 0 {
		t.Errorf("IKEPorts after a failed start: ike %d, want 0 (not running)", ike)
	}
}

// TestParseProcNetUDP reads the sockets of one port from a /proc/net/udp
// table (ports in hex, any local address).
func TestParseProcNetUDP(t *testing.T) {
	table := `   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  120: 00000000:01F4 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 31337 2 0000000000000000 0
  121: 0100A8C0:1194 00000000:0000 07 00000000:00000000 00:00000000 00000000   108        0 4242 2 0000000000000000 0
  122: 00000000:1194 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 0 2 0000000000000000 0
  123: 00000000:1195 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 999 2 0000000000000000 0
  garbage
`
	got := parseProcNetUDP(strings.NewReader(table), 4500)
	if len(got) != 1 || got[0] != (udpSocket{uid: 108, inode: 4242}) {
		t.Errorf("port 4500: %+v, want uid 108 inode 4242 only", got)
	}
	if got := parseProcNetUDP(strings.NewReader(table), 500); len(got) != 1 || got[0].inode != 31337 {
		t.Errorf("port 500: %+v", got)
	}
}

// TestServiceInCgroup takes the service from cgroup v2 and v1 paths.
func TestServiceInCgroup(t *testing.T) {
	for in, want := range map[string]string{
		"0::/system.slice/strongswan-starter.service\n":                     "strongswan-starter.service",
		"12:pids:/system.slice/strongswan.service\n1:name=systemd:/x.scope": "strongswan.service",
		"0::/user.slice/user-0.slice/session-1.scope\n":                     "",
		"": "",
	} {
		if got := serviceInCgroup(in); got != want {
			t.Errorf("serviceInCgroup(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestHolderHint: the likely cause named for each kind of holder.
func TestHolderHint(t *testing.T) {
	defer func(d string) { unitsDir = d }(unitsDir)
	unitsDir = t.TempDir() // no IKE daemon's unit runs
	for _, c := range []struct {
		name    string
		port    int
		holders []portHolder
		want    []string // substrings; nil: no hint
	}{
		{"starter's charon", 4500, []portHolder{{pid: 7, comm: "charon", unit: "strongswan-starter.service"}},
			[]string{"pid 7 (charon) of strongswan-starter.service", "strongswan-starter's charon", "systemctl disable --now strongswan-starter.service", "docs/migrate.md"}},
		{"charon-systemd first", 500, []portHolder{{pid: 8, comm: "charon-systemd", unit: "strongswan.service"}},
			[]string{"pid 8 (charon-systemd)", "systemctl stop strongswan", "socket-default"}},
		{"a charon outside systemd", 500, []portHolder{{pid: 9, comm: "charon"}},
			[]string{"pid 9 (charon)", "a charon outside", "systemctl disable --now strongswan-starter.service"}},
		{"unseen holder of 4500", 4500, nil,
			[]string{"uid 0", "ss -ulpn sport = :4500", "another charon", "strongswan-starter", "strongswan.service"}},
		{"another program on 4500", 4500, []portHolder{{pid: 10, comm: "openvpn", unit: "openvpn.service"}}, nil},
		{"unseen holder of 4501", 4501, nil, nil},
	} {
		socks := []udpSocket{{uid: 0, inode: 1}}
		got := describeHolders(c.port, socks, c.holders)
		if c.want == nil {
			if strings.Contains(got, "charon") || strings.Contains(got, "systemctl") {
				t.Errorf("%s: %q names a cause", c.name, got)
			}
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q does not say %q", c.name, got, w)
			}
		}
	}
}

// TestHolderHintFromUnits: a holder espd cannot see (the packaged units
// hide root's processes from it) is named by the IKE daemon's unit that
// systemd runs, for IKE's ports only.
func TestHolderHintFromUnits(t *testing.T) {
	defer func(d string) { unitsDir = d }(unitsDir)
	unitsDir = t.TempDir()
	run := func(unit string) {
		t.Helper()
		if err := os.Symlink("0123456789abcdef0123456789abcdef", filepath.Join(unitsDir, "invocation:"+unit)); err != nil {
			t.Fatal(err)
		}
	}
	socks := []udpSocket{{uid: 0, inode: 1}}
	run("strongswan.service")
	if got := describeHolders(4500, socks, nil); !strings.Contains(got, "strongswan.service runs, likely the holder") || !strings.Contains(got, "systemctl stop strongswan") {
		t.Errorf("with strongswan.service running: %q", got)
	}
	run("strongswan-starter.service")
	for _, port := range []int{500, 4500} {
		got := describeHolders(port, socks, nil)
		for _, w := range []string{"process espd cannot see", "strongswan-starter.service runs, likely the holder", "systemctl disable --now strongswan-starter.service", "docs/migrate.md"} {
			if !strings.Contains(got, w) {
				t.Errorf("port %d with strongswan-starter.service running: %q does not say %q", port, got, w)
			}
		}
	}
	if got := describeHolders(4501, socks, nil); strings.Contains(got, "charon") || strings.Contains(got, "runs") {
		t.Errorf("port 4501 blames a running charon: %q", got)
	}
	if got := describeHolders(4500, socks, []portHolder{{pid: 10, comm: "openvpn", unit: "openvpn.service"}}); strings.Contains(got, "strongswan") {
		t.Errorf("a holder espd sees is not charon, yet: %q", got)
	}
}
