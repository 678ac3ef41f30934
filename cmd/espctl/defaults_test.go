package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/config"
	"github.com/espd/espd/control"
	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
	"github.com/espd/espd/sa"
)

// A state as each keying path writes it: the same values (or the same
// absence of values) through the control protocol (a Go client sending a
// whole Config built from sa.DefaultConfig, and one sending only some
// attributes), espctl and the configuration file.
type pathCase struct {
	name string
	// set applies the explicit values to a Config (the Client path).
	set func(c *sa.Config)
	// fields are the attributes the partial client sends besides the
	// required ones.
	fields wire.Fields
	// flags and toml are the same values for espctl and the file.
	flags []string
	toml  string
}

var pathCases = []pathCase{
	{name: "nothing optional"},
	{
		name: "explicit values",
		set: func(c *sa.Config) {
			c.ReplayWindow, c.ECN, c.CopyDSCP, c.DSCP, c.DF, c.TTL, c.TFCPadTo, c.ReqID = 0, false, false, 46, esp.DFSet, 32, 300, 5
		},
		fields: wire.FieldReplayWindow | wire.FieldECN | wire.FieldDSCP | wire.FieldDF | wire.FieldTTL | wire.FieldTFC | wire.FieldReqID,
		flags:  []string{"--replay-window", "0", "--ecn=false", "--dscp", "46", "--df", "set", "--ttl", "32", "--tfc", "300", "--reqid", "5"},
		toml:   "replay_window = 0\necn = false\ndscp = \"46\"\ndf = \"set\"\nttl = 32\ntfc_pad_to = 300\nreqid = 5\n",
	},
	{
		name:   "large window",
		set:    func(c *sa.Config) { c.ReplayWindow = esp.MaxReplayWindow },
		fields: wire.FieldReplayWindow,
		flags:  []string{"--replay-window", "65536"},
		toml:   "replay_window = 65536\n",
	},
	{
		name:   "transport mode",
		set:    func(c *sa.Config) { c.Mode = sa.ModeTransport },
		fields: wire.FieldMode,
		flags:  []string{"--mode", "transport"},
		toml:   "mode = \"transport\"\n",
	},
}

// TestDefaultsSameOnEveryPath installs the same inbound state through each
// keying path and checks that espd ends up with the same sa.Config, field
// by field; with nothing optional given, that is sa.DefaultConfig.
func TestDefaultsSameOnEveryPath(t *testing.T) {
	d := startDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := control.Dial(ctx, d.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	src, dst := netip.MustParseAddr("198.18.0.2"), netip.MustParseAddr("198.18.0.1")
	suite := crypto.Suite{Encryption: crypto.EncrAESGCM16, KeyBits: 128}
	spi := uint32(0x10000)
	// keyHex is a key of its own for each state (espd refuses a key
	// that another state uses).
	keyHex := func(spi uint32) string { return fmt.Sprintf("%08x", spi) + gcmKey[10:] }

	for _, tc := range pathCases {
		t.Run(tc.name, func(t *testing.T) {
			got := map[string]sa.Config{}
			install := func(path string, add func(spi uint32) error) {
				t.Helper()
				spi++
				if err := add(spi); err != nil {
					t.Fatalf("%s: %v", path, err)
				}
				s, ok := d.db.GetSA(spi, dst)
				if !ok {
					t.Fatalf("%s: state not installed", path)
				}
				cfg := s.Config()
				cfg.SPI = 0
				got[path] = cfg
			}
			base := func(spi uint32) sa.Config {
				cfg := sa.DefaultConfig()
				cfg.SPI, cfg.Dir, cfg.Src, cfg.Dst, cfg.Suite = spi, sa.DirIn, src, dst, suite
				cfg.EncKey, _ = config.ParseKey("k", keyHex(spi), 20)
				cfg.IntegKey = []byte{}
				if tc.set != nil {
					tc.set(&cfg)
				}
				return cfg
			}
			install("Client.AddSA from sa.DefaultConfig", func(spi uint32) error {
				return c.AddSA(ctx, base(spi))
			})
			install("SA_ADD with absent attributes", func(spi uint32) error {
				return c.AddSAFields(ctx, base(spi), wire.FieldSrc|wire.FieldDst|wire.FieldDir|wire.FieldSuite|wire.FieldKeys|tc.fields)
			})
			install("espctl", func(spi uint32) error {
				args := append([]string{"sa", "add", "--spi", fmt.Sprint(spi), "--src", src.String(), "--dst", dst.String(),
					"--dir", "in", "--enc", "aes128gcm16", "--enc-key-file", "-"}, tc.flags...)
				d.espctlIn(t, 0, keyHex(spi), args...)
				return nil
			})
			install("config file", func(spi uint32) error {
				text := fmt.Sprintf("[[sa]]\nspi = %d\ndir = \"in\"\nsrc = \"%v\"\ndst = \"%v\"\nsuite = \"aes128gcm16\"\nenc_key = \"%s\"\n%s",
					spi, src, dst, keyHex(spi), tc.toml)
				f, err := config.Parse("espd.toml", []byte(text))
				if err != nil {
					return err
				}
				defer f.Wipe()
				_, err = d.db.AddSA(f.SAs[0]) // what the daemon does with the file
				return err
			})
			want := got["Client.AddSA from sa.DefaultConfig"]
			if tc.set == nil {
				def := base(0)
				def.EncKey, def.IntegKey = nil, nil
				compareConfigs(t, "nothing given, against sa.DefaultConfig", want, def)
				// Tunnel mode is the default on every path.
				for path, cfg := range got {
					if cfg.Mode != sa.ModeTunnel {
						t.Errorf("%s: nothing given, mode %v, want tunnel", path, cfg.Mode)
					}
				}
			}
			for path, cfg := range got {
				compareConfigs(t, path, cfg, want)
			}
		})
	}
}

// compareConfigs reports every field in which got differs from want.
func compareConfigs(t *testing.T, path string, got, want sa.Config) {
	t.Helper()
	gv, wv := reflect.ValueOf(got), reflect.ValueOf(want)
	for i := range gv.NumField() {
		if g, w := gv.Field(i).Interface(), wv.Field(i).Interface(); !reflect.DeepEqual(g, w) {
			t.Errorf("%s: %s = %v, want %v", path, gv.Type().Field(i).Name, g, w)
		}
	}
}

// TestReservedRefusedOnEveryPath checks that SPIs 1-255 (and 0) and replay
// windows above esp.MaxReplayWindow are refused, with an error that says
// why, through the control protocol, espctl and the configuration file.
func TestReservedRefusedOnEveryPath(t *testing.T) {
	d := startDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := control.Dial(ctx, d.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	src, dst := netip.MustParseAddr("198.18.0.2"), netip.MustParseAddr("198.18.0.1")
	key, _ := config.ParseKey("k", gcmKey, 20)
	cases := []struct {
		spi    uint32
		window string
		want   string
	}{
		{1, "", "SPI 1 is reserved: RFC 4303"},
		{255, "", "SPI 255 is reserved"},
		{0, "", "SPI 0 is reserved"},
		{0x3000, "65537", "replay window 65537 is above the maximum of 65536 packets"},
		{0x3001, "4294967295", "replay window 4294967295 is above the maximum"},
	}
	for _, tc := range cases {
		cfg := sa.DefaultConfig()
		cfg.SPI, cfg.Dir, cfg.Src, cfg.Dst = tc.spi, sa.DirIn, src, dst
		cfg.Suite = crypto.Suite{Encryption: crypto.EncrAESGCM16, KeyBits: 128}
		cfg.EncKey, cfg.IntegKey = key, []byte{}
		fields := wire.FieldSrc | wire.FieldDst | wire.FieldDir | wire.FieldSuite | wire.FieldKeys
		args := []string{"sa", "add", "--spi", fmt.Sprint(tc.spi), "--src", src.String(), "--dst", dst.String(), "--dir", "in",
			"--enc", "aes128gcm16", "--enc-key-file", "-"}
		toml := fmt.Sprintf("[[sa]]\nspi = %d\ndir = \"in\"\nsrc = \"%v\"\ndst = \"%v\"\nsuite = \"aes128gcm16\"\nenc_key = \"%s\"\n", tc.spi, src, dst, gcmKey)
		if tc.window != "" {
			var w uint32
			fmt.Sscan(tc.window, &w)
			cfg.ReplayWindow = w
			fields |= wire.FieldReplayWindow
			args = append(args, "--replay-window", tc.window)
			toml += "replay_window = " + tc.window + "\n"
		}
		for name, err := range map[string]error{
			"Client.AddSA":     c.AddSA(ctx, cfg),
			"SA_ADD (partial)": c.AddSAFields(ctx, cfg, fields),
		} {
			var e *wire.Error
			if !errorsAs(err, &e) || e.Code != wire.EINVAL || !strings.Contains(e.Msg, tc.want) {
				t.Errorf("%s spi %d window %q: %v, want EINVAL %q", name, tc.spi, tc.window, err, tc.want)
			}
		}
		_, stderr := d.espctlIn(t, exitError, gcmKey, args...)
		if !strings.Contains(stderr, tc.want) {
			t.Errorf("espctl spi %d window %q: %q, want %q", tc.spi, tc.window, stderr, tc.want)
		}
		if _, err := config.Parse("espd.toml", []byte(toml)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("config spi %d window %q: %v, want %q", tc.spi, tc.window, err, tc.want)
		}
	}
	if n := len(d.db.SAs()); n != 0 {
		t.Fatalf("%d states installed", n)
	}
}

func errorsAs(err error, target **wire.Error) bool { return errors.As(err, target) }

// TestPolicyModeSameOnEveryPath installs the same policy through the Go
// client, espctl and the configuration file, without a mode and with mode
// transport: espd gets the same sa.Policy from each, tunnel mode when none
// is given.
func TestPolicyModeSameOnEveryPath(t *testing.T) {
	d := startDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := control.Dial(ctx, d.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for ti, tc := range []struct {
		name  string
		mode  sa.Mode // what the client sets
		flags []string
		toml  string
	}{
		{"nothing given", sa.ModeTunnel, nil, ""},
		{"transport", sa.ModeTransport, []string{"--mode", "transport"}, "mode = \"transport\"\n"},
	} {
		got := map[string]sa.Policy{}
		for i, path := range []string{"Client.AddPolicy", "espctl", "config file"} {
			sel := sa.Selector{Src: netip.MustParsePrefix("198.18.0.1/32"), Dst: netip.MustParsePrefix(fmt.Sprintf("198.19.%d.%d/32", ti, i))}
			switch path {
			case "Client.AddPolicy":
				reply, err := c.AddPolicy(ctx, sa.Policy{Selector: sel, Dir: sa.DirOut, Action: sa.ActionProtect, ReqID: 7, Mode: tc.mode})
				if err != nil || reply.Mode != tc.mode {
					t.Fatalf("%s %s: reply %v (%v)", tc.name, path, reply, err)
				}
			case "espctl":
				d.espctl(t, 0, append([]string{"policy", "add", "--dir", "out", "--src", sel.Src.String(), "--dst", sel.Dst.String(), "--reqid", "7"}, tc.flags...)...)
			case "config file":
				f, err := config.Parse("espd.toml", []byte(fmt.Sprintf("[[policy]]\nsrc = \"%v\"\ndst = \"%v\"\ndir = \"out\"\nreqid = 7\n%s", sel.Src, sel.Dst, tc.toml)))
				if err != nil {
					t.Fatalf("%s %s: %v", tc.name, path, err)
				}
				if _, err := d.db.AddPolicy(f.Policies[0]); err != nil { // what the daemon does with the file
					t.Fatalf("%s %s: %v", tc.name, path, err)
				}
			}
			p, ok := d.db.GetPolicy(sa.PolicyID{Selector: sel, Dir: sa.DirOut})
			if !ok {
				t.Fatalf("%s %s: policy not installed", tc.name, path)
			}
			p.Selector, p.Index = sa.Selector{}, 0
			got[path] = p
		}
		for path, p := range got {
			if p != got["Client.AddPolicy"] || p.Mode != tc.mode {
				t.Errorf("%s %s: %v, want %v with mode %v", tc.name, path, p, got["Client.AddPolicy"], tc.mode)
			}
		}
	}
}

// TestTransportTFCRefusedOnEveryPath: a transport-mode state with TFC
// padding is refused, with sa's reason, through the control protocol,
// espctl and the configuration file; tunnel mode is what lets it pad.
func TestTransportTFCRefusedOnEveryPath(t *testing.T) {
	d := startDaemon(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := control.Dial(ctx, d.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	src, dst := netip.MustParseAddr("198.18.0.2"), netip.MustParseAddr("198.18.0.1")
	key, _ := config.ParseKey("k", gcmKey, 20)
	const want = "transport mode takes no TFC padding (tfc 300)"
	cfg := sa.DefaultConfig()
	cfg.SPI, cfg.Dir, cfg.Src, cfg.Dst, cfg.Mode, cfg.TFCPadTo = 0x5001, sa.DirOut, src, dst, sa.ModeTransport, 300
	cfg.Suite = crypto.Suite{Encryption: crypto.EncrAESGCM16, KeyBits: 128}
	cfg.EncKey, cfg.IntegKey = key, []byte{}
	fields := wire.FieldSrc | wire.FieldDst | wire.FieldDir | wire.FieldSuite | wire.FieldKeys | wire.FieldMode | wire.FieldTFC
	for name, err := range map[string]error{
		"Client.AddSA":     c.AddSA(ctx, cfg),
		"SA_ADD (partial)": c.AddSAFields(ctx, cfg, fields),
	} {
		var e *wire.Error
		if !errorsAs(err, &e) || e.Code != wire.EINVAL || !strings.Contains(e.Msg, want) {
			t.Errorf("%s: %v, want EINVAL %q", name, err, want)
		}
	}
	_, stderr := d.espctlIn(t, exitError, gcmKey, "sa", "add", "--spi", "0x5001", "--src", src.String(), "--dst", dst.String(), "--dir", "out",
		"--enc", "aes128gcm16", "--enc-key-file", "-", "--mode", "transport", "--tfc", "300")
	if !strings.Contains(stderr, want) {
		t.Errorf("espctl: %q, want %q", stderr, want)
	}
	toml := fmt.Sprintf("[[sa]]\nspi = 0x5001\ndir = \"out\"\nsrc = \"%v\"\ndst = \"%v\"\nsuite = \"aes128gcm16\"\nenc_key = \"%s\"\nmode = \"transport\"\ntfc_pad_to = 300\n", src, dst, gcmKey)
	if _, err := config.Parse("espd.toml", []byte(toml)); err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "espd.toml:1: sa #1: ") {
		t.Errorf("config: %v, want espd.toml:1: sa #1: ...%q", err, want)
	}
	if n := len(d.db.SAs()); n != 0 {
		t.Fatalf("%d states installed", n)
	}
	cfg.Mode = sa.ModeTunnel
	if err := c.AddSA(ctx, cfg); err != nil {
		t.Fatalf("tunnel mode with TFC padding: %v", err)
	}
}

// TestSAAddManySelectors: sa add with 200 selectors is a control message
// above 4 KiB, the connection's first that large (it failed with "bad
// magic 0x0000" before the server kept the header it had read).
func TestSAAddManySelectors(t *testing.T) {
	d := startDaemon(t)
	args := []string{"sa", "add", "--spi", "0x7001", "--src", "198.18.0.2", "--dst", "198.18.0.1", "--dir", "in",
		"--enc", "aes128gcm16", "--enc-key-file", "-"}
	for i := range 200 {
		args = append(args, "--sel", fmt.Sprintf("src=198.18.%d.0/24,dst=198.19.%d.0/24,proto=tcp,dport=%d", i, i, 1000+i))
	}
	d.espctlIn(t, 0, gcmKey, args...)
	s, ok := d.db.GetSA(0x7001, netip.MustParseAddr("198.18.0.1"))
	if !ok || len(s.Config().Selectors) != 200 {
		t.Fatalf("state with 200 selectors not installed")
	}
	out, _ := d.espctl(t, 0, "--json", "sa", "get", "--spi", "0x7001", "--dst", "198.18.0.1")
	if strings.Count(out, "198.19.") != 200 {
		t.Fatalf("sa get shows %d selectors", strings.Count(out, "198.19."))
	}
}
