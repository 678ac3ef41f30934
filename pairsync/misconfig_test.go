package pairsync

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

// TestMisconfigured: two nodes that disagree refuse each other's
// messages, count them (and log them), and so never hold a report of
// the other fresh nor record anything of it: the same node number (each
// node's messages are authentic only under its own key, as a message
// sent back would be, but of another run), another block size,
// interval, lease or link address, or an own address of the other's.
func TestMisconfigured(t *testing.T) {
	addr := netip.MustParseAddr
	for _, c := range []struct {
		name string
		edit func(a, b *Config)
	}{
		{"same node number", func(a, b *Config) { b.Node = 1 }},
		{"block size", func(a, b *Config) { a.SeqBlock, b.SeqBlock = 1<<20, 1<<16 }},
		{"interval", func(a, b *Config) { b.Interval = testInterval / 2 }},
		{"lease", func(a, b *Config) { b.Lease = 2 * testLease }},
		{"link address", func(a, b *Config) { b.Link = netip.MustParseAddrPort("198.18.9.3:4520") }},
		{"own address shared", func(a, b *Config) {
			a.Locals, b.Locals = []netip.Addr{addr("198.18.0.1")}, []netip.Addr{addr("198.18.0.1")}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newFakePair(t, c.edit)
			p.a.SetRole(RoleActive)
			if _, err := p.b.Resume(fp(8), true); err != nil {
				t.Fatal(err)
			}
			reserveBounded(t, p.b, fp(8), 2<<20)
			reserveBounded(t, p.a, fp(1), 1<<20)
			waitFor(t, "both nodes refusing", func() bool {
				return p.a.Stats().Misconfigured > 2 && p.b.Stats().Misconfigured > 2
			})
			for i, n := range []*Node{p.a, p.b} {
				st := n.Stats()
				if st.Received != [6]uint64{} || st.SplitBrain != 0 || st.Reflected != 0 {
					t.Errorf("node %d took a misconfigured node's message: %+v", i+1, st)
				}
				if _, heard := n.PeerHeard(); heard {
					t.Errorf("node %d heard a misconfigured node", i+1)
				}
				if !n.Conflict() {
					t.Errorf("node %d reports no conflict", i+1)
				}
			}
			if _, ok := p.b.Report(fp(1)); ok {
				t.Error("the standby holds the misconfigured active's report fresh")
			}
			if _, ok := p.b.Ledger().Reserved(fp(1)); ok {
				t.Error("the standby recorded the misconfigured active's reservation")
			}
			if _, ok := p.a.Ledger().Reserved(fp(8)); ok {
				t.Error("the active recorded the misconfigured standby's own reservation")
			}
		})
	}
}

// TestNewNodeRefuses: a node number other than 1 or 2, an own address
// that is the other node's link address, or too many own addresses.
func TestNewNodeRefuses(t *testing.T) {
	base := func() Config {
		return Config{Key: testKey, Node: 1, Conn: &fakeConn{local: fakeAddr1, closed: make(chan struct{})}, Peer: fakeAddr2,
			Store: newMemStore(), Interval: time.Second, Lease: 5 * time.Second}
	}
	many := make([]netip.Addr, MaxLocals+1)
	for i := range many {
		many[i] = netip.AddrFrom4([4]byte{198, 18, 1, byte(i)})
	}
	for name, edit := range map[string]func(*Config){
		"node 0":                 func(c *Config) { c.Node = 0 },
		"node 3":                 func(c *Config) { c.Node = 3 },
		"own address the peer's": func(c *Config) { c.Locals = []netip.Addr{netip.MustParseAddr("198.18.9.2")} },
		"too many own addresses": func(c *Config) { c.Locals = many },
	} {
		c := base()
		edit(&c)
		if _, err := NewNode(c); err == nil {
			t.Errorf("%s: accepted", name)
		} else if strings.Contains(err.Error(), "%!") {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := NewNode(base()); err != nil {
		t.Fatal(err)
	}
}
