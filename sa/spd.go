package sa

import (
	"slices"

	"github.com/espd/espd/packet"
)

// spd is the policy database of one direction, searched by tuple space
// search (Srinivasan, Suri and Varghese, SIGCOMM 1999): the policies are
// grouped into tuples by the family and length of their source and
// destination prefixes; each tuple is a hash table keyed by the masked
// addresses, whose buckets list the tuple's policies with those addresses
// in rank order, to be checked for protocol and ports after the hash hit.
// The tuples are searched in the order of the best rank they hold, so the
// search stops at the first tuple that cannot beat the match in hand.
//
// Readers take no lock; the writer (serialized by DB.spdMu) publishes a new
// tuple order when a tuple appears, disappears or its bound improves.
type spd struct {
	// order holds the tuples in search order for readers: [0] all of
	// them, [1] those an IPv4 flow can match, [2] those an IPv6 flow can.
	order  [3]atomicSlice[tupleRef]
	tuples map[tupleID]*tuple // writer only
}

// tupleID names a tuple: the family (famNone: any) and length of the
// source and destination prefixes.
type tupleID struct{ srcFam, srcLen, dstFam, dstLen uint8 }

type tuple struct {
	id                     tupleID
	smHi, smLo, dmHi, dmLo uint64 // prefix masks
	table                  *lfTable[polKey, []*policyEntry]

	// Writer only. bound is at most the rank of every policy in the tuple,
	// equal to the best one while exact; after the best one is deleted it
	// stays as a valid lower bound until enough deletions make recomputing
	// it worthwhile (amortized O(1) per deletion).
	n         int
	bound     rank
	exact     bool
	staleDels int
}

// tupleRef is a tuple with the bound it had when the order was published.
type tupleRef struct {
	t     *tuple
	bound rank
}

// flowBits is a flow prepared for lookup.
type flowBits struct {
	sHi, sLo, dHi, dLo uint64
	sFam, dFam         uint8
	proto              uint8
	sport, dport       uint16
}

func prepareFlow(f *packet.Flow) flowBits {
	var b flowBits
	b.sHi, b.sLo, b.sFam = addrBits(f.Src)
	b.dHi, b.dLo, b.dFam = addrBits(f.Dst)
	b.proto, b.sport, b.dport = f.Proto, f.SrcPort, f.DstPort
	return b
}

func newSPD() *spd {
	s := &spd{tuples: make(map[tupleID]*tuple)}
	s.publish()
	return s
}

// flush removes every policy. Writer only.
func (s *spd) flush() {
	clear(s.tuples)
	s.publish()
}

func tupleOf(sel *Selector) tupleID {
	sf, sl := prefixFam(sel.Src)
	df, dl := prefixFam(sel.Dst)
	return tupleID{srcFam: sf, srcLen: uint8(sl), dstFam: df, dstLen: uint8(dl)}
}

func newTuple(id tupleID) *tuple {
	t := &tuple{id: id, table: newLFTable[polKey, []*policyEntry]()}
	t.smHi, t.smLo = maskBits(int(id.srcLen))
	t.dmHi, t.dmLo = maskBits(int(id.dstLen))
	return t
}

// keyOfSelector returns the hash key of a selector in its tuple.
func (t *tuple) keyOfSelector(sel *Selector) polKey {
	var k polKey
	if sel.Src.IsValid() {
		hi, lo, _ := addrBits(sel.Src.Addr())
		k.sHi, k.sLo = hi&t.smHi, lo&t.smLo
	}
	if sel.Dst.IsValid() {
		hi, lo, _ := addrBits(sel.Dst.Addr())
		k.dHi, k.dLo = hi&t.dmHi, lo&t.dmLo
	}
	return k
}

// lookup returns the best policy matching f, or nil. It does not allocate.
func (s *spd) lookup(f *flowBits) *policyEntry {
	order := &s.order[0]
	if f.sFam == f.dFam && f.sFam != famNone {
		order = &s.order[famOrder(f.sFam)]
	}
	var best *policyEntry
	for _, r := range order.load() {
		if best != nil && best.rank.less(r.bound) {
			break
		}
		t := r.t
		if !famFits(t.id.srcFam, f.sFam) || !famFits(t.id.dstFam, f.dFam) {
			continue
		}
		k := polKey{f.sHi & t.smHi, f.sLo & t.smLo, f.dHi & t.dmHi, f.dLo & t.dmLo}
		list, _ := t.table.get(k)
		for _, e := range list {
			if e.matchesRest(f) {
				if best == nil || e.rank.less(best.rank) {
					best = e
				}
				break
			}
		}
	}
	return best
}

// insert adds e. Writer only.
func (s *spd) insert(e *policyEntry) {
	id := tupleOf(&e.Selector)
	t := s.tuples[id]
	if t == nil {
		t = newTuple(id)
		s.tuples[id] = t
	}
	k := t.keyOfSelector(&e.Selector)
	list, _ := t.table.get(k)
	i, _ := slices.BinarySearchFunc(list, e, func(a, b *policyEntry) int { return cmpRank(a.rank, b.rank) })
	t.table.put(k, slices.Insert(slices.Clip(list), i, e))
	t.n++
	if t.n == 1 || e.rank.less(t.bound) {
		t.bound, t.exact, t.staleDels = e.rank, true, 0
		s.publish()
	}
}

// remove deletes e, which must be installed. Writer only.
func (s *spd) remove(e *policyEntry) {
	id := tupleOf(&e.Selector)
	t := s.tuples[id]
	k := t.keyOfSelector(&e.Selector)
	list, _ := t.table.get(k)
	i := slices.Index(list, e)
	if i < 0 {
		return
	}
	if len(list) == 1 {
		t.table.remove(k)
	} else {
		t.table.put(k, slices.Delete(slices.Clone(list), i, i+1))
	}
	t.n--
	if t.n == 0 {
		delete(s.tuples, id)
		s.publish()
		return
	}
	if t.exact && e.rank == t.bound {
		t.exact, t.staleDels = false, 0
	}
	if !t.exact {
		t.staleDels++
		if t.staleDels >= t.n {
			t.recomputeBound()
			s.publish()
		}
	}
}

// recomputeBound sets the exact bound: the best first entry of the buckets.
func (t *tuple) recomputeBound() {
	first := true
	t.table.all(func(_ polKey, list []*policyEntry) bool {
		if first || list[0].rank.less(t.bound) {
			t.bound, first = list[0].rank, false
		}
		return true
	})
	t.exact, t.staleDels = true, 0
}

// publish stores the tuple order for readers. Writer only.
func (s *spd) publish() {
	refs := make([]tupleRef, 0, len(s.tuples))
	for _, t := range s.tuples {
		refs = append(refs, tupleRef{t: t, bound: t.bound})
	}
	slices.SortFunc(refs, func(a, b tupleRef) int { return cmpRank(a.bound, b.bound) })
	s.order[0].store(refs)
	for _, fam := range []uint8{fam4, fam6} {
		sub := make([]tupleRef, 0, len(refs))
		for _, r := range refs {
			if famFits(r.t.id.srcFam, fam) && famFits(r.t.id.dstFam, fam) {
				sub = append(sub, r)
			}
		}
		s.order[famOrder(fam)].store(sub)
	}
}

// famFits reports whether a selector prefix of family sel can hold an
// address of family fam.
func famFits(sel, fam uint8) bool { return sel == famNone || sel == fam }

// famOrder returns the index in spd.order of the tuples a flow of family
// fam can match.
func famOrder(fam uint8) int {
	if fam == fam4 {
		return 1
	}
	return 2
}

func cmpRank(a, b rank) int {
	switch {
	case a.less(b):
		return -1
	case b.less(a):
		return 1
	}
	return 0
}
