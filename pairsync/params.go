package pairsync

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// Params are what the two nodes of a pair must agree on. Every message
// carries their digest, its sender's node number and its sender's own
// addresses under the MAC; a node refuses (and counts, and logs) an
// authentic message that claims its own number, or other parameters,
// or own addresses that overlap its own (checkPeer).
type Params struct {
	// SeqBlock is the size of the sequence blocks the nodes alternate
	// (sa.Options.SeqBlock).
	SeqBlock uint64
	// Interval and Lease are Config's.
	Interval, Lease time.Duration
	// Links are the pair link's addresses of node 1 and of node 2.
	Links [2]netip.AddrPort
}

// Digest returns the digest of p that messages carry.
func (p *Params) Digest() Digest {
	h := sha256.New()
	h.Write([]byte("espd pair parameters v2\x00"))
	var b []byte
	b = binary.BigEndian.AppendUint64(b, p.SeqBlock)
	b = binary.BigEndian.AppendUint64(b, uint64(p.Interval))
	b = binary.BigEndian.AppendUint64(b, uint64(p.Lease))
	for _, l := range p.Links {
		a := l.Addr().Unmap().As16()
		b = append(b, a[:]...)
		b = binary.BigEndian.AppendUint16(b, l.Port())
	}
	h.Write(b)
	var d Digest
	copy(d[:], h.Sum(nil))
	return d
}

// checkLocals returns an error if this node's own addresses cannot be
// right: too many, or one of them the other node's link address.
func checkLocals(locals []netip.Addr, peer netip.AddrPort) error {
	if len(locals) > MaxLocals {
		return fmt.Errorf("pairsync: %d addresses of this node alone, at most %d", len(locals), MaxLocals)
	}
	if slices.Contains(locals, peer.Addr().Unmap()) {
		return fmt.Errorf("pairsync: %v is the other node's link address, not one of this node alone", peer.Addr())
	}
	return nil
}

// checkPeer returns why an authentic message m of the other node is
// refused, "" if it is not: it claims this node's number (or none of the
// pair's), other parameters, or own addresses that are also this node's
// or this node's link address (a copied --pair-local-addr: both nodes
// would number such a state's key from every block).
func (n *Node) checkPeer(m *Message) string {
	if int(m.Node) != 3-n.cfg.Node {
		return fmt.Sprintf("it claims node number %d, this node is %d: give the nodes different --pair-node", m.Node, n.cfg.Node)
	}
	if m.Params != n.digest {
		return "its block size, interval, lease or link addresses differ from this node's: configure both alike"
	}
	own := n.link.Addr().Unmap()
	for _, a := range m.Locals {
		if a == own || slices.Contains(n.cfg.Locals, a) {
			return fmt.Sprintf("it declares %v its own (--pair-local-addr), but it is this node's", a)
		}
	}
	return ""
}
