package main

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
	"github.com/espd/espd/sa"
)

const (
	gcmKey  = "0x000102030405060708090a0b0c0d0e0f10111213" // 20 bytes: aes128gcm16
	cbcKey  = "000102030405060708090a0b0c0d0e0f000102030405060708090a0b0c0d0e0f"
	shaKey  = "101112131415161718191a1b1c1d1e1f101112131415161718191a1b1c1d1e1f"
	shaKey1 = "1011121314151617181910111213141516171819"
)

func parseSA(t *testing.T, name string, full bool, which []string, args ...string) (sa.Config, wire.Fields, error) {
	t.Helper()
	return parseSAStdin(t, name, full, which, "", args...)
}

// parseSAStdin is parseSA with this standard input.
func parseSAStdin(t *testing.T, name string, full bool, which []string, stdin string, args ...string) (sa.Config, wire.Fields, error) {
	t.Helper()
	f := newSAFlags(name, which...)
	f.stdin = strings.NewReader(stdin)
	f.fs.SetOutput(new(bytes.Buffer))
	if err := f.parse(args); err != nil {
		return sa.Config{}, 0, err
	}
	return f.config(full)
}

// keyFile writes text to a new file of mode 0600 and returns its path.
func keyFile(t *testing.T, text string) string {
	t.Helper()
	return keyFileMode(t, text, 0o600)
}

func keyFileMode(t *testing.T, text string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(p, []byte(text), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSAAddFlags(t *testing.T) {
	c, fields, err := parseSA(t, "sa add", true, []string{"config"},
		"--spi", "0xc0000001", "--src", "198.18.0.1", "--dst", "198.18.0.2", "--dir", "out",
		"--enc", "aes256", "--auth", "sha256", "--enc-key-file", keyFile(t, cbcKey), "--integ-key-file", keyFile(t, "0X"+shaKey+"\n"), "--esn",
		"--replay-window", "64", "--encap-sport", "4500", "--encap-dport", "4501", "--reqid", "7", "--if-id", "42",
		"--sel", "src=198.18.1.0/24,dst=198.19.0.0/16,proto=tcp,sport=1024-65535,dport=443",
		"--sel", "dst=2001:db8::/32",
		"--soft-bytes", "1000000", "--soft-packets", "1000", "--soft-add", "3000", "--soft-use", "10m",
		"--hard-bytes", "2000000", "--hard-packets", "2000", "--hard-add", "1h", "--hard-use", "20m",
		"--ttl", "32", "--dscp", "copy", "--ecn", "--df", "clear", "--tfc", "1200", "--proto", "esp", "--mode", "tunnel")
	if err != nil {
		t.Fatal(err)
	}
	want := sa.Config{
		SPI: 0xc0000001, Dir: sa.DirOut, Src: netip.MustParseAddr("198.18.0.1"), Dst: netip.MustParseAddr("198.18.0.2"),
		Suite:        crypto.Suite{Encryption: crypto.EncrAESCBC, KeyBits: 256, Integrity: crypto.AuthHMACSHA2256128, ESN: true},
		ReplayWindow: 64, EncapSrcPort: 4500, EncapDstPort: 4501, ReqID: 7, IfID: 42,
		Selectors: []sa.Selector{
			{Src: netip.MustParsePrefix("198.18.1.0/24"), Dst: netip.MustParsePrefix("198.19.0.0/16"), Proto: 6,
				SrcPorts: sa.PortRange{Lo: 1024, Hi: 65535}, DstPorts: sa.PortRange{Lo: 443, Hi: 443}},
			{Dst: netip.MustParsePrefix("2001:db8::/32")},
		},
		Soft: sa.Lifetime{Bytes: 1000000, Packets: 1000, AddTime: 3000 * time.Second, UseTime: 10 * time.Minute},
		Hard: sa.Lifetime{Bytes: 2000000, Packets: 2000, AddTime: time.Hour, UseTime: 20 * time.Minute},
		TTL:  32, CopyDSCP: true, ECN: true, DF: esp.DFClear, TFCPadTo: 1200,
	}
	if len(c.EncKey) != 32 || len(c.IntegKey) != 32 || c.EncKey[1] != 1 || c.IntegKey[0] != 0x10 {
		t.Fatalf("keys: %d %d", len(c.EncKey), len(c.IntegKey))
	}
	if !slices.Equal(c.Selectors, want.Selectors) {
		t.Fatalf("selectors %v", c.Selectors)
	}
	c.EncKey, c.IntegKey, c.Selectors, want.Selectors = nil, nil, nil, nil
	if c.String() != want.String() || c.Suite != want.Suite || c.Soft != want.Soft || c.Hard != want.Hard {
		t.Fatalf("config\n got %v\nwant %v", c, want)
	}
	// NEGOTIATED is never among them: keys given to espctl are manual.
	if want := wire.FieldsAll &^ (wire.FieldOSeq | wire.FieldReplay | wire.FieldNegotiated); fields != want {
		t.Fatalf("fields %b, want %b", fields, want)
	}
	// An AEAD suite by its full name, an IPv6 state, the key from
	// standard input; only what was given is sent.
	c, fields, err = parseSAStdin(t, "sa add", true, []string{"config"}, gcmKey+"\n",
		"--spi", "4096", "--src", "2001:db8::1", "--dst", "2001:db8::2", "--dir", "in", "--enc", "aes128gcm16-esn", "--enc-key-file", "-")
	if err != nil || c.Suite.Encryption != crypto.EncrAESGCM16 || !c.Suite.ESN || c.SPI != 4096 || len(c.EncKey) != 20 || len(c.IntegKey) != 0 {
		t.Fatalf("gcm: %v %v", c, err)
	}
	if want := wire.FieldSrc | wire.FieldDst | wire.FieldDir | wire.FieldSuite | wire.FieldKeys; fields != want {
		t.Fatalf("fields %b, want %b: espctl must leave the defaults to espd", fields, want)
	}
}

func TestSAUpdateFlags(t *testing.T) {
	c, fields, err := parseSA(t, "sa update", false, []string{"config", "update"},
		"--spi", "0x10", "--dst", "198.18.0.2", "--new-dst", "198.18.0.3", "--encap-sport", "0", "--encap-dport", "0", "--dscp", "10", "--soft-packets", "5")
	if err != nil {
		t.Fatal(err)
	}
	want := wire.FieldDst | wire.FieldEncap | wire.FieldDSCP | wire.FieldCopyDSCP | wire.FieldSoft
	if fields != want || c.Dst != netip.MustParseAddr("198.18.0.3") || c.DSCP != 10 || c.CopyDSCP || c.Soft.Packets != 5 {
		t.Fatalf("update: %v fields %b", c, fields)
	}
	var l sa.Lifetime = sa.Lifetime{Packets: 5}
	mergeLifetime(&l, sa.Lifetime{Bytes: 9, Packets: 1, AddTime: time.Hour}, map[string]bool{"soft-packets": true}, "soft")
	if l != (sa.Lifetime{Bytes: 9, Packets: 5, AddTime: time.Hour}) {
		t.Fatalf("merge: %+v", l)
	}
}

func TestPolicyFlags(t *testing.T) {
	f := newPolicyFlags("policy add", true)
	if err := f.parse([]string{"--src", "198.18.1.0/24", "--dst", "198.19.0.1", "--proto", "udp", "--sport", "any", "--dport", "53",
		"--dir", "fwd", "--action", "drop", "--priority", "5", "--reqid", "3", "--tmpl-src", "198.18.0.1", "--tmpl-dst", "198.18.0.2"}); err != nil {
		t.Fatal(err)
	}
	p, err := f.policy()
	if err != nil {
		t.Fatal(err)
	}
	want := sa.Policy{Selector: sa.Selector{Src: netip.MustParsePrefix("198.18.1.0/24"), Dst: netip.MustParsePrefix("198.19.0.1/32"),
		Proto: 17, DstPorts: sa.PortRange{Lo: 53, Hi: 53}}, Dir: sa.DirFwd, Action: sa.ActionDrop, Priority: 5, ReqID: 3,
		TmplSrc: netip.MustParseAddr("198.18.0.1"), TmplDst: netip.MustParseAddr("198.18.0.2")}
	if p != want {
		t.Fatalf("got %v\nwant %v", p, want)
	}
}

// TestBadInput checks that bad command lines fail with exit code 2 and a
// message naming the problem, before any connection is made.
func TestBadInput(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "nothing.sock")
	add := []string{"sa", "add", "--spi", "0x1000", "--src", "198.18.0.1", "--dst", "198.18.0.2", "--dir", "out"}
	gcm := keyFile(t, gcmKey)
	cbc := keyFile(t, cbcKey)
	sha := keyFile(t, shaKey)
	cases := []struct {
		args []string
		want string
	}{
		{nil, "usage"},
		{[]string{"frob"}, `unknown command "frob"`},
		{[]string{"sa"}, "sa needs a subcommand"},
		{[]string{"sa", "zap"}, `unknown command "sa" "zap"`},
		{[]string{"sa", "add", "--spi", "1"}, "needs --src"},
		{[]string{"sa", "add", "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"sa", "list", "extra"}, `unexpected argument "extra"`},
		{append(add, "--enc", "aes128gcm16", "--enc-key", gcmKey), "--enc-key is no longer accepted: a key on the command line is visible to every local user"},
		{append(add, "--enc", "aes128gcm16", "--enc-key="+gcmKey), "give --enc-key-file PATH, or --enc-key-file - to read it from standard input"},
		{append(add, "--enc", "aes128", "--auth", "sha1", "--enc-key-file", cbc, "-auth-key", shaKey), "--auth-key is no longer accepted"},
		{append(add, "--enc", "aes128", "--auth", "sha1", "--enc-key-file", cbc, "--integ-key", shaKey), "--integ-key-file PATH"},
		{[]string{"sa", "update", "--spi", "0x1000", "--dst", "198.18.0.2", "--enc-key", gcmKey}, "--enc-key is no longer accepted"},
		{append(add, "--enc", "aes128gcm16"), "--enc-key-file: aes128gcm16 takes 20 bytes of encryption key (40 hex digits, salt included): give a file"},
		{append(add, "--enc", "aes128gcm16", "--enc-key-file", keyFile(t, "0x123")), "odd number of hex digits"},
		{append(add, "--enc", "aes128gcm16", "--enc-key-file", keyFile(t, "zz")), "not valid hex"},
		{append(add, "--enc", "aes128gcm16", "--enc-key-file", keyFile(t, "\n")), "is empty"},
		{append(add, "--enc", "aes128gcm16", "--enc-key-file", keyFileMode(t, gcmKey, 0o644)), "accessible to other users (mode 0644)"},
		{append(add, "--enc", "aes128gcm16", "--enc-key-file", keyFileMode(t, gcmKey, 0o602)), "chmod o-rw"},
		{append(add, "--enc", "aes128gcm16", "--enc-key-file", filepath.Join(t.TempDir(), "none")), "no such file"},
		{append(add, "--enc", "aes128gcm16", "--enc-key-file", keyFile(t, "00112233445566778899aabbccddeeff")), "takes 20 bytes of encryption key (40 hex digits, salt included), got 16"},
		{append(add, "--enc", "aes128gcm16", "--enc-key-file", gcm, "--integ-key-file", keyFile(t, "01")), "combined-mode and takes no integrity key"},
		{append(add, "--enc", "aes256", "--enc-key-file", cbc), `"aes256" needs an integrity algorithm`},
		{append(add, "--enc", "aes128", "--auth", "sha1", "--enc-key-file", keyFile(t, cbcKey[:32]), "--integ-key-file", sha), "takes 20 bytes of integrity key"},
		{append(add, "--enc", "aes128", "--auth", "sha1", "--enc-key-file", keyFile(t, cbcKey[:32])), "--integ-key-file: aes128-sha1 takes 20 bytes of integrity key (40 hex digits): give a file"},
		{append(add, "--enc", "aes128", "--auth", "sha1", "--enc-key-file", "-", "--integ-key-file", "-"), "want two lines, the encryption key and then the integrity key, in hex; got 0"},
		{append(add, "--enc", "3des-sha1", "--enc-key-file", gcm), "3des"},
		{[]string{"sa", "add", "--spi", "x1", "--src", "198.18.0.1", "--dst", "198.18.0.2", "--dir", "out", "--enc", "aes128gcm16", "--enc-key-file", gcm}, `SPI "x1"`},
		{[]string{"sa", "add", "--spi", "0x1000", "--src", "198.18.0.1", "--dst", "198.18.0.2", "--dir", "fwd", "--enc", "aes128gcm16", "--enc-key-file", gcm}, "a state is in or out"},
		{[]string{"sa", "add", "--spi", "0x1000", "--src", "198.18.0.300", "--dst", "198.18.0.2", "--dir", "in", "--enc", "aes128gcm16", "--enc-key-file", gcm}, "not an IP address"},
		{append(add, "--enc", "aes128gcm16", "--enc-key-file", gcm, "--encap-sport", "4500"), "needs both --encap-sport and --encap-dport"},
		{append(add, "--enc", "aes128gcm16", "--enc-key-file", gcm, "--sel", "src=198.18.0.0/16,port=80"), `unknown key "port"`},
		{append(add, "--enc", "aes128gcm16", "--enc-key-file", gcm, "--sel", "dport=80-20"), "dport"},
		{append(add, "--enc", "aes128gcm16", "--enc-key-file", gcm, "--sel", "src=198.18.0.0/16,dst=2001:db8::/32"), "mixes address families"},
		{append(add, "--enc", "aes128gcm16", "--enc-key-file", gcm, "--proto", "ah"), "esp only"},
		{append(add, "--enc", "aes128gcm16", "--enc-key-file", gcm, "--mode", "beet"), `mode "beet": want tunnel or transport`},
		{append(add, "--enc", "aes128gcm16", "--enc-key-file", gcm, "--mode", ""), `mode "": want tunnel or transport`},
		{[]string{"sa", "update", "--spi", "1", "--dst", "198.18.0.2", "--mode", "Transport"}, `mode "Transport": want tunnel or transport`},
		{[]string{"policy", "add", "--dir", "out", "--reqid", "1", "--mode", "tunel"}, `mode "tunel": want tunnel or transport`},
		{append(add, "--enc", "aes128gcm16", "--enc-key-file", gcm, "--ttl", "300"), "ttl"},
		{append(add, "--enc", "aes128gcm16", "--enc-key-file", gcm, "--dscp", "64"), "want copy or a number 0-63"},
		{append(add, "--enc", "aes128gcm16", "--enc-key-file", gcm, "--df", "maybe"), "copy, set or clear"},
		{append(add, "--enc", "aes128gcm16", "--enc-key-file", gcm, "--soft-add", "soon"), "duration"},
		{[]string{"sa", "update", "--spi", "1", "--dst", "198.18.0.2"}, "nothing to change"},
		{[]string{"sa", "update", "--spi", "1", "--dst", "198.18.0.2", "--src", "198.18.0.1"}, "use --new-src"},
		{[]string{"sa", "update", "--spi", "1", "--dst", "198.18.0.2", "--auth", "sha1"}, "go with --enc"},
		{[]string{"sa", "del", "--spi", "1"}, "--spi and --dst name the state"},
		{[]string{"policy", "add", "--dst", "198.19.0.0/16", "--reqid", "1"}, "needs --dir"},
		{[]string{"policy", "add", "--dir", "out", "--dport", "80", "--reqid", "1"}, "ports need --proto"},
		{[]string{"policy", "add", "--dir", "out"}, "needs --reqid"},
		{[]string{"policy", "add", "--dir", "out", "--action", "maybe"}, "protect, bypass or drop"},
		{[]string{"policy", "add", "--dir", "sideways"}, "in, out or fwd"},
		{[]string{"policy", "del", "--dir", "in", "--src", "198.18.0.0/33"}, "not a prefix"},
		{[]string{"policy", "get", "--dir", "in", "--proto", "tcpp"}, `proto "tcpp"`},
		{[]string{"spi", "alloc", "--min", "0x200", "--max", "0x100"}, "is above --max"},
		{[]string{"stats", "--spi", "1"}, "--spi and --dst name the state"},
		{[]string{"monitor", "--events", "soft,boom"}, `unknown event "boom"`},
		{[]string{"pair"}, "pair needs a subcommand (role, status)"},
		{[]string{"pair", "roles"}, `unknown command "pair" "roles" (role, status)`},
		{[]string{"pair", "role"}, "pair role needs active or standby"},
		{[]string{"pair", "role", "--json"}, "pair role needs active or standby"},
		{[]string{"pair", "role", "master"}, `pair role "master": want active or standby`},
		{[]string{"pair", "role", "Active"}, `want active or standby`},
		{[]string{"pair", "role", "active", "standby"}, `unexpected argument "standby"`},
		{[]string{"pair", "role", "active", "--node", "1"}, "flag provided but not defined: -node"},
		{[]string{"pair", "status", "active"}, `unexpected argument "active"`},
	}
	for _, c := range cases {
		var out, errb bytes.Buffer
		code := run(context.Background(), append([]string{"-s", sock}, c.args...), strings.NewReader(""), &out, &errb)
		if code != exitUsage || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%q: exit %d, stderr %q; want exit 2 and %q", c.args, code, errb.String(), c.want)
		}
		for _, k := range []string{gcmKey[2:], cbcKey, shaKey} {
			if strings.Contains(errb.String(), k) {
				t.Errorf("%q: stderr %q repeats a key", c.args, errb.String())
			}
		}
		if out.Len() != 0 {
			t.Errorf("%q: stdout %q", c.args, out.String())
		}
	}
	// A well-formed command without a daemon fails with exit code 1.
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"-s", sock, "sa", "list"}, nil, &out, &errb); code != exitError ||
		!strings.Contains(errb.String(), "connecting to espd at "+sock) {
		t.Fatalf("no daemon: exit %d, %q", code, errb.String())
	}
}

func TestParsers(t *testing.T) {
	if p, err := parsePorts("x", "1024-65535"); err != nil || p != (sa.PortRange{Lo: 1024, Hi: 65535}) {
		t.Fatal(p, err)
	}
	if p, err := parsePorts("x", "any"); err != nil || !p.Any() {
		t.Fatal(p, err)
	}
	if _, err := parsePorts("x", "70000"); err == nil {
		t.Fatal("port 70000 accepted")
	}
	if p, err := parseProto("ipv6-icmp"); err != nil || p != 58 {
		t.Fatal(p, err)
	}
	if d, err := parseDuration("x", "90"); err != nil || d != 90*time.Second {
		t.Fatal(d, err)
	}
	if p, err := parsePrefix("p", "198.18.0.0/24"); err != nil || p != netip.MustParsePrefix("198.18.0.0/24") {
		t.Fatal(p, err)
	}
	if _, err := parsePrefix("p", "198.18.0.7/24"); err == nil || !strings.Contains(err.Error(), "198.18.0.0/24") {
		t.Fatalf("a prefix with host bits: %v, want an error suggesting 198.18.0.0/24", err)
	}
	if a, err := parseAddr("a", "::ffff:198.18.0.1"); err != nil || a != netip.MustParseAddr("198.18.0.1") {
		t.Fatal(a, err)
	}
	if k, err := parseEventKinds("soft,acquire,mapping"); err != nil ||
		!slices.Equal(k, []wire.EventKind{wire.EventSoftExpire, wire.EventAcquire, wire.EventMapping}) {
		t.Fatal(k, err)
	}
}

// TestKeyInput reads keys from files and standard input in each way
// espctl allows.
func TestKeyInput(t *testing.T) {
	add := []string{"--spi", "0x1000", "--src", "198.18.0.1", "--dst", "198.18.0.2", "--dir", "out", "--enc", "aes128", "--auth", "sha1"}
	enc, integ := cbcKey[:32], shaKey1
	cases := []struct {
		name, stdin string
		args        []string
	}{
		{"two files", "", []string{"--enc-key-file", keyFile(t, enc), "--integ-key-file", keyFile(t, "0x"+integ+"\n")}},
		{"--auth-key-file", "", []string{"--enc-key-file", keyFile(t, enc), "--auth-key-file", keyFile(t, integ)}},
		{"both from standard input", "0x" + enc + "\n\n  " + integ + "  \r\n", []string{"--enc-key-file", "-", "--integ-key-file", "-"}},
		{"encryption key from standard input", enc[:16] + "\n" + enc[16:] + "\n", []string{"--enc-key-file", "-", "--integ-key-file", keyFile(t, integ)}},
		{"integrity key from standard input", integ, []string{"--enc-key-file", keyFile(t, enc), "--integ-key-file", "-"}},
		{"group-readable file", "", []string{"--enc-key-file", keyFileMode(t, enc, 0o640), "--integ-key-file", keyFileMode(t, integ, 0o440)}},
	}
	for _, c := range cases {
		cfg, fields, err := parseSAStdin(t, "sa add", true, []string{"config"}, c.stdin, append(add, c.args...)...)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if len(cfg.EncKey) != 16 || cfg.EncKey[1] != 0x01 || len(cfg.IntegKey) != 20 || cfg.IntegKey[19] != 0x19 || fields&wire.FieldKeys == 0 {
			t.Errorf("%s: keys of %d and %d bytes", c.name, len(cfg.EncKey), len(cfg.IntegKey))
		}
	}
	// Three lines for two keys, or one.
	for _, in := range []string{enc + "\n" + integ + "\n" + integ + "\n", enc + integ + "\n"} {
		_, _, err := parseSAStdin(t, "sa add", true, []string{"config"}, in, append(add, "--enc-key-file", "-", "--integ-key-file", "-")...)
		if err == nil || !strings.Contains(err.Error(), "want two lines") {
			t.Errorf("%d bytes of standard input: %v", len(in), err)
		}
	}
	// sa update with a new key only.
	cfg, fields, err := parseSAStdin(t, "sa update", false, []string{"config", "update"}, gcmKey, "--spi", "0x1000", "--dst", "198.18.0.2", "--enc-key-file", "-")
	if err != nil || fields != wire.FieldKeys || len(cfg.EncKey) != 20 || len(cfg.IntegKey) != 0 {
		t.Fatalf("update: fields %b, %v", fields, err)
	}
}
