package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
	"github.com/espd/espd/sa"
)

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, " ") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// saFlags are the flags of sa add, update, del and get.
type saFlags struct {
	cmdFlags

	spi, src, dst, newSrc, newDst, dir, proto, mode string
	enc, auth                                       string
	encKeyFile, integKeyFile                        string
	stdin                                           io.Reader // for "-" key files
	esn                                             bool
	replay, encapSport, encapDport, reqid           string
	ifID                                            string
	sels                                            multiFlag
	soft, hard                                      lifetimeFlags
	ttl, dscp, df, tfc                              string
	ecn                                             bool
	oseq, replaySeq, replayBitmap                   string
}

type lifetimeFlags struct{ bytes, packets, add, use string }

// newSAFlags declares the flags of an sa command; which selects the
// groups: "id" (spi, dst), "config" (everything add takes), "update" (the
// new-src and new-dst of update).
func newSAFlags(name string, which ...string) *saFlags {
	f := &saFlags{cmdFlags: cmdFlags{fs: flag.NewFlagSet(name, flag.ContinueOnError)}}
	has := func(w string) bool {
		for _, x := range which {
			if x == w {
				return true
			}
		}
		return false
	}
	fs := f.fs
	fs.StringVar(&f.spi, "spi", "", "SPI, hex (0x...) or decimal")
	fs.StringVar(&f.dst, "dst", "", "outer destination address")
	if has("config") {
		fs.StringVar(&f.src, "src", "", "outer source address")
		fs.StringVar(&f.dir, "dir", "", "direction: in or out")
		fs.StringVar(&f.proto, "proto", "esp", "IPsec protocol: esp")
		fs.StringVar(&f.mode, "mode", "tunnel", "mode: tunnel, or transport (the packets of --src and --dst themselves; no --tfc)")
		fs.StringVar(&f.enc, "enc", "", "algorithms, strongSwan style: aes128gcm16, chacha20poly1305, aes256-sha256, ...")
		fs.StringVar(&f.auth, "auth", "", "integrity algorithm when --enc names only the cipher: sha1, sha256, sha384, sha512")
		fs.StringVar(&f.encKeyFile, "enc-key-file", "", "file holding the encryption key in hex, salt included (- : standard input)")
		fs.StringVar(&f.integKeyFile, "integ-key-file", "", "file holding the integrity key in hex (- : standard input; with both -, two lines)")
		fs.StringVar(&f.integKeyFile, "auth-key-file", "", "same as --integ-key-file")
		fs.BoolVar(&f.esn, "esn", false, "extended sequence numbers")
		fs.StringVar(&f.replay, "replay-window", "", fmt.Sprintf("inbound anti-replay window in packets, up to %d (default %d; 0: off)", esp.MaxReplayWindow, sa.DefaultReplayWindow))
		fs.StringVar(&f.encapSport, "encap-sport", "", "UDP encapsulation source port (with --encap-dport; 0 0: off)")
		fs.StringVar(&f.encapDport, "encap-dport", "", "UDP encapsulation destination port")
		fs.StringVar(&f.reqid, "reqid", "", "reqid tying the state to policies")
		fs.StringVar(&f.ifID, "if-id", "", "interface ID (XFRM's if_id): the route-based interface the state serves (default 0: espd's TUN)")
		fs.Var(&f.sels, "sel", "inner selector src=PREFIX,dst=PREFIX,proto=P,sport=R,dport=R (repeatable)")
		for _, lt := range []struct {
			name string
			l    *lifetimeFlags
		}{{"soft", &f.soft}, {"hard", &f.hard}} {
			fs.StringVar(&lt.l.bytes, lt.name+"-bytes", "", lt.name+" limit in bytes")
			fs.StringVar(&lt.l.packets, lt.name+"-packets", "", lt.name+" limit in packets")
			fs.StringVar(&lt.l.add, lt.name+"-add", "", lt.name+" limit after adding (3600, 1h, ...)")
			fs.StringVar(&lt.l.use, lt.name+"-use", "", lt.name+" limit after first use")
		}
		fs.StringVar(&f.ttl, "ttl", "", fmt.Sprintf("outer TTL / hop limit (default and 0: %d)", sa.DefaultTTL))
		fs.StringVar(&f.dscp, "dscp", "", "outer DSCP 0-63, or copy (default copy)")
		fs.BoolVar(&f.ecn, "ecn", sa.DefaultECN, "RFC 6040 normal-mode ECN (--ecn=false: off)")
		fs.StringVar(&f.df, "df", "", "outer IPv4 DF bit: copy, set or clear (default copy)")
		fs.StringVar(&f.tfc, "tfc", "", "TFC: pad inner packets shorter than this many bytes")
		fs.StringVar(&f.oseq, "oseq", "", "outbound: the last sequence number taken as sent (64-bit with ESN); sending starts above it; update: raises only")
		fs.StringVar(&f.replaySeq, "replay-seq", "", "inbound: the highest sequence number taken as received; all up to it refused but --replay-bitmap's; update: merged")
		fs.StringVar(&f.replayBitmap, "replay-bitmap", "", "inbound, with --replay-seq: hex bytes; bit i (byte i/8, 1<<(i%8)) set: replay-seq minus i was received")
	}
	if has("update") {
		fs.StringVar(&f.newSrc, "new-src", "", "new outer source address")
		fs.StringVar(&f.newDst, "new-dst", "", "new outer destination address")
	}
	return f
}

// id returns the SPI and destination that name a state.
func (f *saFlags) id() (uint32, sa.Config, error) {
	var c sa.Config
	if !f.set["spi"] || !f.set["dst"] {
		return 0, c, errors.New("--spi and --dst name the state")
	}
	spi, err := parseSPI(f.spi)
	if err != nil {
		return 0, c, err
	}
	c.Dst, err = parseAddr("dst", f.dst)
	return spi, c, err
}

// saID parses the flags of a command that names one state (sa del, sa
// get): its SPI and outer destination.
func (a *app) saID(name string, args []string) (uint32, netip.Addr, error) {
	f := newSAFlags(name, "id")
	if err := a.parse(f.fs, f.parse, args); err != nil {
		return 0, netip.Addr{}, err
	}
	spi, id, err := f.id()
	if err != nil {
		return 0, netip.Addr{}, usageError{err}
	}
	return spi, id.Dst, nil
}

// suite builds the algorithms from --enc, --auth and --esn.
func (f *saFlags) suite() (crypto.Suite, error) {
	name := f.enc
	if f.auth != "" {
		name += "-" + f.auth
	}
	s, err := crypto.ParseSuite(name)
	if err != nil {
		return crypto.Suite{}, fmt.Errorf("--enc %q: %v", name, err)
	}
	s.ESN = s.ESN || f.esn
	return s, nil
}

// parse parses args as cmdFlags.parse does, but first refuses the old key
// flags (--enc-key, --auth-key, --integ-key) with an error that says why
// and what to use instead, without repeating the key (the flag package
// would quote the value).
func (f *saFlags) parse(args []string) error {
	for _, a := range args {
		if a == "--" {
			break
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") {
			continue
		}
		switch name {
		case "enc-key":
			return refusedKeyFlag(name, "enc-key-file")
		case "auth-key", "integ-key":
			return refusedKeyFlag(name, "integ-key-file")
		}
	}
	return f.cmdFlags.parse(args)
}

// config builds a configuration from the flags given and says which
// fields they set; the fields not set are left to the daemon, which gives
// them their defaults (sa.DefaultConfig). For add (full), the state's
// identity, direction, algorithms and keys are required. The keys are the
// caller's to zero, also on error.
func (f *saFlags) config(full bool) (sa.Config, wire.Fields, error) {
	var (
		c   sa.Config
		fl  wire.Fields
		err error
	)
	set := f.set
	try := func(e error) {
		if err == nil && e != nil {
			err = e
		}
	}
	if full {
		for _, req := range []string{"spi", "src", "dst", "dir", "enc"} {
			if !set[req] {
				return c, 0, fmt.Errorf("sa add needs --%s", req)
			}
		}
	}
	addr := func(what, s string) netip.Addr {
		a, e := parseAddr(what, s)
		try(e)
		return a
	}
	if set["spi"] {
		v, e := parseSPI(f.spi)
		try(e)
		c.SPI = v
	}
	if full {
		c.Src, c.Dst = addr("src", f.src), addr("dst", f.dst)
		fl |= wire.FieldSrc | wire.FieldDst
	}
	if set["new-src"] {
		c.Src = addr("new-src", f.newSrc)
		fl |= wire.FieldSrc
	}
	if set["new-dst"] {
		c.Dst = addr("new-dst", f.newDst)
		fl |= wire.FieldDst
	}
	if set["proto"] && f.proto != "esp" {
		try(fmt.Errorf("--proto %q: espd implements esp only", f.proto))
	}
	if set["mode"] {
		m, e := parseMode(f.mode)
		try(e)
		c.Mode = m
		fl |= wire.FieldMode
	}
	if set["dir"] {
		d, e := parseStateDir(f.dir)
		try(e)
		c.Dir = d
		fl |= wire.FieldDir
	}
	if set["enc"] || set["auth"] || set["esn"] {
		if !set["enc"] {
			try(errors.New("--auth and --esn go with --enc"))
		} else {
			s, e := f.suite()
			try(e)
			c.Suite = s
			fl |= wire.FieldSuite
			if set["esn"] {
				fl |= wire.FieldESN
			}
		}
	}
	if set["enc-key-file"] || set["integ-key-file"] || set["auth-key-file"] || full {
		ek, ik, e := readKeys(f.encKeyFile, f.integKeyFile, f.stdin)
		try(e)
		if ek == nil {
			ek = []byte{}
		}
		if ik == nil {
			ik = []byte{}
		}
		c.EncKey, c.IntegKey = ek, ik
		fl |= wire.FieldKeys
		if err == nil && fl&wire.FieldSuite != 0 {
			if n := c.Suite.EncKeyLen(); len(ek) != n {
				switch {
				case !set["enc-key-file"]:
					try(fmt.Errorf("--enc-key-file: %v takes %d bytes of encryption key (%d hex digits, salt included): give a file holding it, or - for standard input", c.Suite, n, 2*n))
				case n == 0:
					try(fmt.Errorf("--enc-key-file: %v takes no encryption key", c.Suite))
				default:
					try(fmt.Errorf("--enc-key-file: %v takes %d bytes of encryption key (%d hex digits, salt included), got %d", c.Suite, n, 2*n, len(ek)))
				}
			}
			if n := c.Suite.IntegKeyLen(); len(ik) != n {
				switch {
				case n == 0:
					try(fmt.Errorf("--integ-key-file: %v is combined-mode and takes no integrity key", c.Suite))
				case !set["integ-key-file"] && !set["auth-key-file"]:
					try(fmt.Errorf("--integ-key-file: %v takes %d bytes of integrity key (%d hex digits): give a file holding it, or - for standard input", c.Suite, n, 2*n))
				default:
					try(fmt.Errorf("--integ-key-file: %v takes %d bytes of integrity key (%d hex digits), got %d", c.Suite, n, 2*n, len(ik)))
				}
			}
		}
	}
	if set["replay-window"] {
		v, e := parseU32("replay-window", f.replay)
		try(e)
		c.ReplayWindow = v
		fl |= wire.FieldReplayWindow
	}
	if set["encap-sport"] || set["encap-dport"] {
		if !set["encap-sport"] || !set["encap-dport"] {
			try(errors.New("UDP encapsulation needs both --encap-sport and --encap-dport"))
		}
		sp, e := parseUint("encap-sport", f.encapSport, 65535)
		try(e)
		dp, e := parseUint("encap-dport", f.encapDport, 65535)
		try(e)
		c.EncapSrcPort, c.EncapDstPort = uint16(sp), uint16(dp)
		fl |= wire.FieldEncap
	}
	if set["reqid"] {
		v, e := parseU32("reqid", f.reqid)
		try(e)
		c.ReqID = v
		fl |= wire.FieldReqID
	}
	if set["if-id"] {
		v, e := parseU32("if-id", f.ifID)
		try(e)
		c.IfID = v
		fl |= wire.FieldIfID
	}
	if set["sel"] {
		for _, s := range f.sels {
			sel, e := parseSelector(s)
			try(e)
			c.Selectors = append(c.Selectors, sel)
		}
		fl |= wire.FieldSelectors
	}
	for _, lt := range []struct {
		name  string
		l     *lifetimeFlags
		dst   *sa.Lifetime
		field wire.Fields
	}{{"soft", &f.soft, &c.Soft, wire.FieldSoft}, {"hard", &f.hard, &c.Hard, wire.FieldHard}} {
		n := lt.name
		if set[n+"-bytes"] {
			v, e := parseUint("--"+n+"-bytes", lt.l.bytes, 1<<63)
			try(e)
			lt.dst.Bytes = v
			fl |= lt.field
		}
		if set[n+"-packets"] {
			v, e := parseUint("--"+n+"-packets", lt.l.packets, 1<<63)
			try(e)
			lt.dst.Packets = v
			fl |= lt.field
		}
		if set[n+"-add"] {
			d, e := parseDuration("--"+n+"-add", lt.l.add)
			try(e)
			lt.dst.AddTime = d
			fl |= lt.field
		}
		if set[n+"-use"] {
			d, e := parseDuration("--"+n+"-use", lt.l.use)
			try(e)
			lt.dst.UseTime = d
			fl |= lt.field
		}
	}
	if set["ttl"] {
		v, e := parseUint("ttl", f.ttl, 255)
		try(e)
		c.TTL = uint8(v)
		fl |= wire.FieldTTL
	}
	if set["dscp"] {
		cp, d, e := parseDSCP(f.dscp)
		try(e)
		c.DSCP, c.CopyDSCP = d, cp
		fl |= wire.FieldDSCP | wire.FieldCopyDSCP
	}
	if set["ecn"] {
		c.ECN = f.ecn
		fl |= wire.FieldECN
	}
	if set["df"] {
		m, e := parseDF(f.df)
		try(e)
		c.DF = m
		fl |= wire.FieldDF
	}
	if set["tfc"] {
		v, e := parseUint("tfc", f.tfc, 65535)
		try(e)
		c.TFCPadTo = int(v)
		fl |= wire.FieldTFC
	}
	if set["oseq"] {
		v, e := parseSeq("--oseq", f.oseq)
		try(e)
		c.OSeq = v
		fl |= wire.FieldOSeq
	}
	if set["replay-seq"] {
		v, e := parseSeq("--replay-seq", f.replaySeq)
		try(e)
		c.ReplaySeq = v
		fl |= wire.FieldReplay
	}
	if set["replay-bitmap"] {
		b, e := parseHexBytes("--replay-bitmap", f.replayBitmap)
		try(e)
		c.ReplayBitmap = b
		fl |= wire.FieldReplay
	}
	return c, fl, err
}
