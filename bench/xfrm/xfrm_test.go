package xfrm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"testing"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/testbed"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
)

// fakeHandle records what Install asks the kernel for, and fails the
// first state with stateErr.
type fakeHandle struct {
	states   []*netlink.XfrmState
	policies []*netlink.XfrmPolicy
	stateErr error
	flushed  int
}

func (f *fakeHandle) XfrmStateAdd(st *netlink.XfrmState) error {
	if f.stateErr != nil {
		return f.stateErr
	}
	f.states = append(f.states, st)
	return nil
}
func (f *fakeHandle) XfrmPolicyAdd(p *netlink.XfrmPolicy) error {
	f.policies = append(f.policies, p)
	return nil
}
func (f *fakeHandle) XfrmStateFlush(netlink.Proto) error { f.flushed++; return nil }
func (f *fakeHandle) XfrmPolicyFlush() error             { f.flushed++; return nil }

func key(n int, fill byte) []byte { return bytes.Repeat([]byte{fill}, n) }

func tunnel(t *testing.T, suite string) Tunnel {
	t.Helper()
	s, err := crypto.ParseSuite(suite)
	if err != nil {
		t.Fatal(err)
	}
	return Tunnel{
		Suite: s,
		Local: netip.MustParseAddr("198.18.0.1"), Remote: netip.MustParseAddr("198.18.0.2"),
		LocalNet: netip.MustParsePrefix("198.18.1.0/24"), RemoteNet: netip.MustParsePrefix("198.18.2.0/24"),
		OutSPI: 0x1001, InSPI: 0x2001,
		OutEncKey: key(s.EncKeyLen(), 0xa1), OutIntegKey: key(s.IntegKeyLen(), 0xa2),
		InEncKey: key(s.EncKeyLen(), 0xb1), InIntegKey: key(s.IntegKeyLen(), 0xb2),
		ReqID: 7, ReplayWindow: 32,
	}
}

// kernelAlg is what the kernel expects for each suite (names from the
// kernel's xfrm_algo.c and the RFCs' key and ICV sizes): key bits include
// the 32-bit salt of the AEADs (RFC 4106 section 8.1, RFC 7634 section 2).
var kernelAlg = map[string]struct {
	aead, crypt, auth      string
	encBits, icv, authBits int
	trunc                  int
}{
	"aes128gcm16":      {aead: "rfc4106(gcm(aes))", encBits: 160, icv: 128},
	"aes256gcm16":      {aead: "rfc4106(gcm(aes))", encBits: 288, icv: 128},
	"aes128gcm12":      {aead: "rfc4106(gcm(aes))", encBits: 160, icv: 96},
	"chacha20poly1305": {aead: "rfc7539esp(chacha20,poly1305)", encBits: 288, icv: 128},
	"aes128-sha256":    {crypt: "cbc(aes)", encBits: 128, auth: "hmac(sha256)", authBits: 256, trunc: 128},
	"aes256-sha256":    {crypt: "cbc(aes)", encBits: 256, auth: "hmac(sha256)", authBits: 256, trunc: 128},
	"aes128-sha1":      {crypt: "cbc(aes)", encBits: 128, auth: "hmac(sha1)", authBits: 160, trunc: 96},
	"aes256-sha384":    {crypt: "cbc(aes)", encBits: 256, auth: "hmac(sha384)", authBits: 384, trunc: 192},
	"aes256-sha512":    {crypt: "cbc(aes)", encBits: 256, auth: "hmac(sha512)", authBits: 512, trunc: 256},
}

// algoBytes is struct xfrm_algo_aead / xfrm_algo_auth / xfrm_algo from
// linux/xfrm.h, built by hand: char alg_name[64]; __u32 alg_key_len (bits);
// [__u32 alg_icv_len or alg_trunc_len (bits)]; char alg_key[].
func algoBytes(name string, key []byte, extra ...uint32) []byte {
	b := make([]byte, 64)
	copy(b, name)
	b = binary.NativeEndian.AppendUint32(b, uint32(len(key)*8))
	for _, e := range extra {
		b = binary.NativeEndian.AppendUint32(b, e)
	}
	return append(b, key...)
}

// TestStates checks the states built for every suite the harness runs,
// and that their algorithms serialize through netlink's nl package into
// the kernel's struct layout with the right names and key lengths.
func TestStates(t *testing.T) {
	for suite, want := range kernelAlg {
		t.Run(suite, func(t *testing.T) {
			tn := tunnel(t, suite)
			h := &fakeHandle{}
			if err := Install(h, tn); err != nil {
				t.Fatal(err)
			}
			if len(h.states) != 2 {
				t.Fatalf("%d states", len(h.states))
			}
			for i, st := range h.states {
				out := i == 0
				src, dst, spi, enc, integ, window := tn.Local, tn.Remote, tn.OutSPI, tn.OutEncKey, tn.OutIntegKey, 0
				if !out {
					src, dst, spi, enc, integ, window = tn.Remote, tn.Local, tn.InSPI, tn.InEncKey, tn.InIntegKey, 32
				}
				if !st.Src.Equal(src.AsSlice()) || !st.Dst.Equal(dst.AsSlice()) || uint32(st.Spi) != spi {
					t.Errorf("state %d: %v -> %v spi %#x", i, st.Src, st.Dst, st.Spi)
				}
				if st.Proto != netlink.XFRM_PROTO_ESP || st.Mode != netlink.XFRM_MODE_TUNNEL || st.Reqid != 7 || st.ReplayWindow != window {
					t.Errorf("state %d: proto %v mode %v reqid %d window %d", i, st.Proto, st.Mode, st.Reqid, st.ReplayWindow)
				}
				if st.ESN || st.Encap != nil || st.Mark != nil {
					t.Errorf("state %d: unexpected ESN/encap/mark: %v", i, st)
				}
				if want.aead != "" {
					if st.Aead == nil || st.Crypt != nil || st.Auth != nil {
						t.Fatalf("state %d: want only an AEAD: %v", i, st)
					}
					a := st.Aead
					if a.Name != want.aead || len(a.Key)*8 != want.encBits || a.ICVLen != want.icv || !bytes.Equal(a.Key, enc) {
						t.Errorf("state %d AEAD: %v", i, a)
					}
					m := nl.XfrmAlgoAEAD{AlgKeyLen: uint32(len(a.Key) * 8), AlgICVLen: uint32(a.ICVLen), AlgKey: a.Key}
					copy(m.AlgName[:], a.Name)
					if got, w := m.Serialize(), algoBytes(want.aead, enc, uint32(want.icv)); !bytes.Equal(got, w) {
						t.Errorf("state %d AEAD serializes to\n%x\nwant\n%x", i, got, w)
					}
					continue
				}
				if st.Aead != nil || st.Crypt == nil || st.Auth == nil {
					t.Fatalf("state %d: want a cipher and an integrity algorithm: %v", i, st)
				}
				c, a := st.Crypt, st.Auth
				if c.Name != want.crypt || len(c.Key)*8 != want.encBits || !bytes.Equal(c.Key, enc) {
					t.Errorf("state %d cipher: %v", i, c)
				}
				if a.Name != want.auth || len(a.Key)*8 != want.authBits || a.TruncateLen != want.trunc || !bytes.Equal(a.Key, integ) {
					t.Errorf("state %d integrity: %v", i, a)
				}
				mc := nl.XfrmAlgo{AlgKeyLen: uint32(len(c.Key) * 8), AlgKey: c.Key}
				copy(mc.AlgName[:], c.Name)
				if got, w := mc.Serialize(), algoBytes(want.crypt, enc); !bytes.Equal(got, w) {
					t.Errorf("state %d cipher serializes to %x, want %x", i, got, w)
				}
				ma := nl.XfrmAlgoAuth{AlgKeyLen: uint32(len(a.Key) * 8), AlgTruncLen: uint32(a.TruncateLen), AlgKey: a.Key}
				copy(ma.AlgName[:], a.Name)
				if got, w := ma.Serialize(), algoBytes(want.auth, integ, uint32(want.trunc)); !bytes.Equal(got, w) {
					t.Errorf("state %d integrity serializes to %x, want %x", i, got, w)
				}
			}
			// The states own copies of the keys.
			tn.OutEncKey[0] ^= 0xff
			if algo := firstAlgo(h.states[0]); algo.Key[0] == tn.OutEncKey[0] {
				t.Error("state shares the caller's key slice")
			}
		})
	}
}

func firstAlgo(st *netlink.XfrmState) *netlink.XfrmStateAlgo {
	if st.Aead != nil {
		return st.Aead
	}
	return st.Crypt
}

// TestPolicies checks the out, in and fwd policies of a gateway, their
// selectors (networks, masked) and templates, and that they serialize
// into struct xfrm_userpolicy_info / xfrm_user_tmpl fields the kernel
// reads.
func TestPolicies(t *testing.T) {
	tn := tunnel(t, "aes128gcm16")
	tn.LocalNet = netip.MustParsePrefix("198.18.1.7/24") // masked by Policies
	h := &fakeHandle{}
	if err := Install(h, tn); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		dir      netlink.Dir
		src, dst string
		tsrc     string
		tdst     string
	}{
		{netlink.XFRM_DIR_OUT, "198.18.1.0/24", "198.18.2.0/24", "198.18.0.1", "198.18.0.2"},
		{netlink.XFRM_DIR_IN, "198.18.2.0/24", "198.18.1.0/24", "198.18.0.2", "198.18.0.1"},
		{netlink.XFRM_DIR_FWD, "198.18.2.0/24", "198.18.1.0/24", "198.18.0.2", "198.18.0.1"},
	}
	if len(h.policies) != len(want) {
		t.Fatalf("%d policies, want %d", len(h.policies), len(want))
	}
	for i, w := range want {
		p := h.policies[i]
		if p.Dir != w.dir || p.Src.String() != w.src || p.Dst.String() != w.dst || p.Action != netlink.XFRM_POLICY_ALLOW {
			t.Errorf("policy %d: %v", i, p)
		}
		if len(p.Tmpls) != 1 {
			t.Fatalf("policy %d: %d templates", i, len(p.Tmpls))
		}
		tm := p.Tmpls[0]
		if tm.Src.String() != w.tsrc || tm.Dst.String() != w.tdst || tm.Proto != netlink.XFRM_PROTO_ESP ||
			tm.Mode != netlink.XFRM_MODE_TUNNEL || tm.Reqid != 7 || tm.Spi != 0 {
			t.Errorf("policy %d template: %v", i, tm)
		}
		// The selector as the kernel reads it: addresses at the start of
		// xfrm_address_t, prefix lengths, family.
		sel := nl.XfrmSelector{Family: syscall.AF_INET}
		sel.Daddr.FromIP(p.Dst.IP)
		sel.Saddr.FromIP(p.Src.IP)
		ones, _ := p.Dst.Mask.Size()
		sel.PrefixlenD = uint8(ones)
		ones, _ = p.Src.Mask.Size()
		sel.PrefixlenS = uint8(ones)
		b := sel.Serialize()
		if got := netip.AddrFrom4([4]byte(b[0:4])); got.String()+"/24" != w.dst {
			t.Errorf("policy %d: selector daddr %v", i, got)
		}
		if got := netip.AddrFrom4([4]byte(b[16:20])); got.String()+"/24" != w.src {
			t.Errorf("policy %d: selector saddr %v", i, got)
		}
	}
	if err := Flush(h); err != nil || h.flushed != 2 {
		t.Errorf("Flush: %v, %d flushes", err, h.flushed)
	}
}

// TestUnavailable maps the kernel's refusals to reasons.
func TestUnavailable(t *testing.T) {
	cases := []struct {
		suite    string
		err      error
		unavail  bool
		contains []string
	}{
		{"aes128-sha256", fmt.Errorf("%w: Requested type not found", syscall.EPROTONOSUPPORT), true,
			[]string{"kernel has no ESP", "CONFIG_INET_ESP", "Requested type not found"}},
		{"aes128gcm16", fmt.Errorf("%w: Requested AEAD algorithm not found", syscall.ENOSYS), true,
			[]string{"rfc4106(gcm(aes))", "aes128gcm16", "Requested AEAD algorithm not found"}},
		{"aes128-sha1", syscall.ENOSYS, true, []string{"cbc(aes) + hmac(sha1)"}},
		{"aes128gcm16", syscall.EPERM, true, []string{"CAP_NET_ADMIN"}},
		{"aes128gcm16", syscall.EEXIST, false, []string{"spi 0x00001001", "file exists"}},
	}
	for _, c := range cases {
		h := &fakeHandle{stateErr: c.err}
		err := Install(h, tunnel(t, c.suite))
		var ue *UnavailableError
		if errors.As(err, &ue) != c.unavail {
			t.Errorf("%s %v: unavailable %v, want %v (%v)", c.suite, c.err, !c.unavail, c.unavail, err)
		}
		if !errors.Is(err, c.err) {
			t.Errorf("%s: %v does not wrap %v", c.suite, err, c.err)
		}
		for _, s := range c.contains {
			if !bytes.Contains([]byte(err.Error()), []byte(s)) {
				t.Errorf("%s %v: %q lacks %q", c.suite, c.err, err, s)
			}
		}
		if len(h.policies) != 0 {
			t.Errorf("%s: policies installed after a refused state", c.suite)
		}
	}
	bad := tunnel(t, "aes128gcm16")
	bad.OutEncKey = bad.OutEncKey[:16]
	if err := Install(&fakeHandle{}, bad); err == nil {
		t.Error("Install accepted a short key")
	}
	bad = tunnel(t, "aes128gcm16")
	bad.ReplayWindow = 64
	if err := Install(&fakeHandle{}, bad); err == nil {
		t.Error("Install accepted a replay window above 32 without ESN")
	}
}

// TestKernel installs a tunnel through the real netlink socket in a
// namespace. On a kernel with ESP and the algorithm the states read back
// with the keys given; on one without, the refusal maps to an
// UnavailableError, and the policies (which need no ESP) still round-trip
// through the kernel, so the library's encoding of what Install sends is
// checked either way.
func TestKernel(t *testing.T) {
	if err := testbed.Available(); err != nil {
		t.Skip(err)
	}
	top := testbed.NewT(t, testbed.Options{Prefix: "ebxf"})
	h := NodeHandle{Node: top.GwA}
	for _, suite := range []string{"aes128gcm16", "aes128-sha256"} {
		tn := tunnel(t, suite)
		err := Install(h, tn)
		var ue *UnavailableError
		switch {
		case err == nil:
			states, err := h.XfrmStateList(netlink.FAMILY_V4)
			if err != nil {
				t.Fatal(err)
			}
			if len(states) != 2 {
				t.Fatalf("%s: %d states read back", suite, len(states))
			}
			for _, st := range states {
				want := tn.OutEncKey
				if uint32(st.Spi) == tn.InSPI {
					want = tn.InEncKey
				}
				if a := firstAlgo(&st); a == nil || !bytes.Equal(a.Key, want) {
					t.Errorf("%s: state %#x read back %v", suite, st.Spi, a)
				}
			}
		case errors.As(err, &ue):
			t.Logf("%s: unavailable: %s", suite, ue.Reason)
			if err := InstallPolicies(h, tn); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("%s: %v", suite, err)
		}
		pols, err := h.XfrmPolicyList(netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		if len(pols) != 3 {
			t.Fatalf("%s: %d policies read back", suite, len(pols))
		}
		for i, want := range tn.Policies() {
			var got *netlink.XfrmPolicy
			for j := range pols {
				if pols[j].Dir == want.Dir {
					got = &pols[j]
				}
			}
			if got == nil || got.Src.String() != want.Src.String() || got.Dst.String() != want.Dst.String() ||
				len(got.Tmpls) != 1 || !got.Tmpls[0].Dst.Equal(want.Tmpls[0].Dst) || got.Tmpls[0].Reqid != want.Tmpls[0].Reqid ||
				got.Tmpls[0].Mode != netlink.XFRM_MODE_TUNNEL || got.Tmpls[0].Proto != netlink.XFRM_PROTO_ESP {
				t.Errorf("%s: policy %d (%v) read back as %v", suite, i, want, got)
			}
		}
		if err := Flush(h); err != nil {
			t.Fatal(err)
		}
		if pols, _ := h.XfrmPolicyList(netlink.FAMILY_ALL); len(pols) != 0 {
			t.Errorf("%d policies after Flush", len(pols))
		}
	}
}

// TestTransport: a transport-mode association's states and templates are
// transport mode, between the hosts, and it has out and in policies
// selecting the two addresses but no fwd one.
func TestTransport(t *testing.T) {
	tn := tunnel(t, "aes128gcm16")
	tn.Transport = true
	tn.LocalNet, tn.RemoteNet = netip.MustParsePrefix("198.18.0.1/32"), netip.MustParsePrefix("198.18.0.2/32")
	h := &fakeHandle{}
	if err := Install(h, tn); err != nil {
		t.Fatal(err)
	}
	if len(h.states) != 2 {
		t.Fatalf("%d states", len(h.states))
	}
	for i, st := range h.states {
		if st.Mode != netlink.XFRM_MODE_TRANSPORT || st.Proto != netlink.XFRM_PROTO_ESP {
			t.Errorf("state %d: mode %v proto %v", i, st.Mode, st.Proto)
		}
	}
	if !h.states[0].Src.Equal(tn.Local.AsSlice()) || !h.states[1].Dst.Equal(tn.Local.AsSlice()) {
		t.Errorf("states %v -> %v, %v -> %v", h.states[0].Src, h.states[0].Dst, h.states[1].Src, h.states[1].Dst)
	}
	want := []struct {
		dir      netlink.Dir
		src, dst string
	}{
		{netlink.XFRM_DIR_OUT, "198.18.0.1/32", "198.18.0.2/32"},
		{netlink.XFRM_DIR_IN, "198.18.0.2/32", "198.18.0.1/32"},
	}
	if len(h.policies) != len(want) {
		t.Fatalf("%d policies, want %d (no fwd)", len(h.policies), len(want))
	}
	for i, w := range want {
		p := h.policies[i]
		if p.Dir != w.dir || p.Src.String() != w.src || p.Dst.String() != w.dst || len(p.Tmpls) != 1 ||
			p.Tmpls[0].Mode != netlink.XFRM_MODE_TRANSPORT || p.Tmpls[0].Reqid != tn.ReqID {
			t.Errorf("policy %d: %v %v -> %v, templates %+v", i, p.Dir, p.Src, p.Dst, p.Tmpls)
		}
	}
	// Tunnel mode is unchanged: the templates say so, and fwd is there.
	tn.Transport = false
	if ps := tn.Policies(); len(ps) != 3 || ps[2].Dir != netlink.XFRM_DIR_FWD || ps[0].Tmpls[0].Mode != netlink.XFRM_MODE_TUNNEL {
		t.Errorf("tunnel-mode policies %v", ps)
	}
}
