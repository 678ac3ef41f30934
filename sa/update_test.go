package sa

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/esp"
)

// TestUpdateSAKeepsState moves a state to new endpoints and UDP ports
// (MOBIKE) and changes its lifetimes, selectors and outer options; its
// sequence numbers, replay window and counters carry on.
func TestUpdateSAKeepsState(t *testing.T) {
	db, _ := newTestDB(t)
	out := mustAdd(t, db, testConfig(0x1100, DirOut, 4))
	in := mustAdd(t, db, testConfig(0x1101, DirIn, 4))
	out.ReserveSeq(41)
	out.Account(41, 4100)
	out.Drop(DropTooBig, 2)
	in.Account(7, 700)
	rw := in.Decapsulator().Replay
	if err := rw.Update(5); err != nil {
		t.Fatal(err)
	}

	newDst := netip.MustParseAddr("198.18.5.5")
	c := out.Config()
	c.Dst = newDst
	c.EncapSrcPort, c.EncapDstPort = 4500, 31000
	c.TTL, c.CopyDSCP, c.ECN, c.DF, c.TFCPadTo = 9, true, true, esp.DFSet, 300
	c.Soft = Lifetime{Bytes: 1 << 20}
	c.Hard = Lifetime{Bytes: 2 << 20, AddTime: time.Hour}
	c.Selectors = []Selector{{Src: pfx("198.19.0.0/24")}}
	if err := db.UpdateSA(c); err != nil { // keys nil: unchanged
		t.Fatal(err)
	}
	if _, ok := db.GetSA(0x1100, remote); ok {
		t.Error("state still found at its old destination")
	}
	if s, ok := db.GetSA(0x1100, newDst); !ok || s != out {
		t.Error("state not found at its new destination")
	}
	enc := out.Encapsulator()
	want := esp.Outer{Src: local, Dst: newDst, SrcPort: 4500, DstPort: 31000, TTL: 9, CopyDSCP: true, ECN: true, DF: esp.DFSet}
	if enc.Outer != want || enc.TFCPadTo != 300 || enc.SPI != 0x1100 {
		t.Errorf("encapsulator after update: %+v, want outer %+v", enc, want)
	}
	if first, _ := out.ReserveSeq(1); first != 42 {
		t.Errorf("sequence numbers restarted: next is %d, want 42", first)
	}
	st := out.Stats()
	if st.Packets != 41 || st.Bytes != 4100 || st.Drops[DropTooBig] != 2 {
		t.Errorf("counters reset: %+v", st)
	}
	got := out.Config()
	if got.Hard != c.Hard || got.Soft != c.Soft || len(got.Selectors) != 1 || got.Dst != newDst {
		t.Errorf("config after update: %v", got)
	}
	if out.AllowsInner(flow("198.20.0.1", "198.19.0.1", 6, 1, 1)) || !out.AllowsInner(flow("198.19.0.1", "198.20.0.1", 6, 1, 1)) {
		t.Error("selectors not updated")
	}

	ci := in.Config()
	ci.Src = netip.MustParseAddr("198.18.6.6")
	ci.ECN = true
	ci.EncKey = testConfig(0x1101, DirIn, 4).EncKey // the same key is no change
	if err := db.UpdateSA(ci); err != nil {
		t.Fatal(err)
	}
	dec := in.Decapsulator()
	if dec.Replay != rw || !dec.ECN || dec.Replay.Top() != 5 {
		t.Error("inbound update lost the replay window or the ECN option")
	}
	if in.Stats().Packets != 7 {
		t.Error("inbound counters reset")
	}
}

func TestUpdateSARefusals(t *testing.T) {
	db, _ := newTestDB(t)
	mustAdd(t, db, testConfig(0x1200, DirIn, 4))
	base := testConfig(0x1200, DirIn, 4)
	cases := map[string]func(*Config){
		"keys":          func(c *Config) { c.EncKey = append(testKey(19), 0) },
		"algorithm":     func(c *Config) { c.Suite = gcm128ESN },
		"reqid":         func(c *Config) { c.ReqID = 5 },
		"replay window": func(c *Config) { c.ReplayWindow = 128 },
	}
	for what, f := range cases {
		c := base
		f(&c)
		err := db.UpdateSA(c)
		if err == nil {
			t.Errorf("UpdateSA changed the %s", what)
			continue
		}
		if !errors.Is(err, ErrImmutable) {
			t.Errorf("%s: %v, want ErrImmutable", what, err)
		}
		if !strings.Contains(err.Error(), "delete the state and add a new one") {
			t.Errorf("%s: error %q does not say what to do", what, err)
		}
	}
	missing := testConfig(0x1299, DirIn, 4)
	if err := db.UpdateSA(missing); !errors.Is(err, ErrNotFound) {
		t.Errorf("update of a missing state: %v", err)
	}
	// Two outbound states with one SPI and reqid: a moved destination is
	// ambiguous.
	a := testConfig(0x1300, DirOut, 6)
	b := a
	b.Dst = netip.MustParseAddr("198.18.0.7")
	b.EncKey = testStateKey(len(b.EncKey), 0x13ff, DirOut)
	mustAdd(t, db, a)
	mustAdd(t, db, b)
	a.Dst = netip.MustParseAddr("198.18.0.8")
	if err := db.UpdateSA(a); err == nil || !strings.Contains(err.Error(), "current destination") {
		t.Errorf("ambiguous update: %v", err)
	}
	// Moving onto an occupied (SPI, dst) is refused: here the inbound
	// state 0x1200 to local.
	o := testConfig(0x1200, DirOut, 4)
	mustAdd(t, db, o)
	o.Dst = local
	if err := db.UpdateSA(o); !errors.Is(err, ErrStateExists) {
		t.Errorf("update onto another state's SPI and destination: %v", err)
	}
}
