package sa

import (
	"math/rand/v2"
	"sync/atomic"
)

// hashKey is the key of an lfTable: comparable, and able to hash itself
// with a per-table seed.
type hashKey interface {
	comparable
	hash(seed uint64) uint64
}

// lfTable is a chained hash table that readers use without locks or
// allocation while one writer at a time (serialized by the caller) changes
// it. A published node is never modified: a writer prepends new nodes,
// replaces or removes a node by copying the part of the chain in front of
// it, and grows the table by building a new bucket array and publishing it
// with one atomic store. A reader therefore always walks a consistent
// chain, of the table as it was at some instant during its lookup.
type lfTable[K hashKey, V any] struct {
	seed uint64
	cur  atomic.Pointer[lfBuckets[K, V]]
	n    int // entries; touched by the writer only
}

type lfBuckets[K hashKey, V any] struct {
	slots []atomic.Pointer[lfNode[K, V]]
	mask  uint64
}

type lfNode[K hashKey, V any] struct {
	key  K
	val  V
	next *lfNode[K, V]
}

const lfMinSlots = 8

func newLFTable[K hashKey, V any]() *lfTable[K, V] {
	t := &lfTable[K, V]{seed: rand.Uint64()}
	t.cur.Store(newLFBuckets[K, V](lfMinSlots))
	return t
}

func newLFBuckets[K hashKey, V any](n int) *lfBuckets[K, V] {
	return &lfBuckets[K, V]{slots: make([]atomic.Pointer[lfNode[K, V]], n), mask: uint64(n - 1)}
}

// get returns the value stored under k. It takes no lock and does not
// allocate.
func (t *lfTable[K, V]) get(k K) (V, bool) {
	b := t.cur.Load()
	for n := b.slots[k.hash(t.seed)&b.mask].Load(); n != nil; n = n.next {
		if n.key == k {
			return n.val, true
		}
	}
	var zero V
	return zero, false
}

// put stores v under k, replacing any value there, and reports whether one
// was. Writer only.
func (t *lfTable[K, V]) put(k K, v V) bool {
	b := t.cur.Load()
	slot := &b.slots[k.hash(t.seed)&b.mask]
	head := slot.Load()
	for n := head; n != nil; n = n.next {
		if n.key == k {
			slot.Store(relink(head, n, &lfNode[K, V]{key: k, val: v, next: n.next}))
			return true
		}
	}
	slot.Store(&lfNode[K, V]{key: k, val: v, next: head})
	t.n++
	if t.n > len(b.slots) {
		t.resize(2 * len(b.slots))
	}
	return false
}

// remove deletes k and reports whether it was there. Writer only.
func (t *lfTable[K, V]) remove(k K) bool {
	b := t.cur.Load()
	slot := &b.slots[k.hash(t.seed)&b.mask]
	head := slot.Load()
	for n := head; n != nil; n = n.next {
		if n.key == k {
			slot.Store(relink(head, n, n.next))
			t.n--
			if len(b.slots) > lfMinSlots && t.n < len(b.slots)/8 {
				t.resize(len(b.slots) / 2)
			}
			return true
		}
	}
	return false
}

// relink returns a chain equal to the one at head with node old replaced
// by the chain tail, copying the nodes in front of old.
func relink[K hashKey, V any](head, old, tail *lfNode[K, V]) *lfNode[K, V] {
	if head == old {
		return tail
	}
	first := &lfNode[K, V]{key: head.key, val: head.val}
	last := first
	for n := head.next; n != old; n = n.next {
		c := &lfNode[K, V]{key: n.key, val: n.val}
		last.next = c
		last = c
	}
	last.next = tail
	return first
}

// resize publishes a copy of the table with n slots. Writer only.
func (t *lfTable[K, V]) resize(n int) {
	old := t.cur.Load()
	nb := newLFBuckets[K, V](n)
	for i := range old.slots {
		for c := old.slots[i].Load(); c != nil; c = c.next {
			s := &nb.slots[c.key.hash(t.seed)&nb.mask]
			s.Store(&lfNode[K, V]{key: c.key, val: c.val, next: s.Load()})
		}
	}
	t.cur.Store(nb)
}

// clear removes every entry. Writer only.
func (t *lfTable[K, V]) clear() {
	t.cur.Store(newLFBuckets[K, V](lfMinSlots))
	t.n = 0
}

// len returns the number of entries. Writer only.
func (t *lfTable[K, V]) len() int { return t.n }

// all calls f for each entry of the table as published when all started,
// until f returns false.
func (t *lfTable[K, V]) all(f func(K, V) bool) {
	b := t.cur.Load()
	for i := range b.slots {
		for n := b.slots[i].Load(); n != nil; n = n.next {
			if !f(n.key, n.val) {
				return
			}
		}
	}
}

// mix64 is the splitmix64 finalizer: a fast bijective scrambler.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// u32Key is a table key for SPIs and reqids.
type u32Key uint32

func (k u32Key) hash(seed uint64) uint64 { return mix64(seed ^ uint64(k)) }
