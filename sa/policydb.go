package sa

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/espd/espd/packet"
)

// spdb is the policy half of DB.
type spdb struct {
	mu sync.Mutex
	// dirs holds the policies of interface ID 0 (espd's policy-based
	// TUN) by direction; ifaces those of the route-based interfaces, a
	// map replaced whole (under mu) when an interface ID gains its
	// first policy or loses its last, so that lookups take no lock.
	dirs      [numDirections]*spd
	ifaces    atomic.Pointer[map[uint32]*ifaceSPD]
	byID      map[policyID]*policyEntry
	byIndex   map[uint32]*policyEntry
	nextIndex uint32 // index generator, steps of 8
	age       uint64 // insertion counter
}

// ifaceSPD is a route-based interface's policies by direction, and how
// many there are.
type ifaceSPD struct {
	dirs [numDirections]*spd
	n    int // writer only
}

// spdOf returns the policy database of interface ifID and direction dir,
// making it if need be. Called with mu held.
func (s *spdb) spdOf(ifID uint32, dir Direction) *spd {
	if ifID == 0 {
		return s.dirs[dir]
	}
	var m map[uint32]*ifaceSPD
	if cur := s.ifaces.Load(); cur != nil {
		m = *cur
	}
	if is := m[ifID]; is != nil {
		return is.dirs[dir]
	}
	is := &ifaceSPD{}
	for d := range is.dirs {
		is.dirs[d] = newSPD()
	}
	next := maps.Clone(m)
	if next == nil {
		next = make(map[uint32]*ifaceSPD)
	}
	next[ifID] = is
	s.ifaces.Store(&next)
	return is.dirs[dir]
}

// counted notes that interface ifID gained (delta 1) or lost (-1) a
// policy, dropping its database with its last one. Called with mu held.
func (s *spdb) counted(ifID uint32, delta int) {
	if ifID == 0 {
		return
	}
	cur := s.ifaces.Load()
	is := (*cur)[ifID]
	if is.n += delta; is.n > 0 {
		return
	}
	next := maps.Clone(*cur)
	delete(next, ifID)
	s.ifaces.Store(&next)
}

func (s *spdb) init() {
	for d := range s.dirs {
		s.dirs[d] = newSPD()
	}
	s.byID = make(map[policyID]*policyEntry)
	s.byIndex = make(map[uint32]*policyEntry)
}

// LookupPolicy returns the policy of interface ifID (Policy.IfID; 0 for
// espd's policy-based TUN) and direction dir that applies to the flow: the
// best ranked (see Policy.Priority) among those whose selector matches.
// Policies of other interfaces never match. It takes no lock, does not
// allocate, and does not scan the policies linearly (see spd).
func (db *DB) LookupPolicy(ifID uint32, dir Direction, f packet.Flow) (Policy, bool) {
	if dir >= numDirections {
		return Policy{}, false
	}
	d := db.spdb.dirs[dir]
	if ifID != 0 {
		m := db.spdb.ifaces.Load()
		if m == nil || (*m)[ifID] == nil {
			return Policy{}, false
		}
		d = (*m)[ifID].dirs[dir]
	}
	fb := prepareFlow(&f)
	if e := d.lookup(&fb); e != nil {
		return e.Policy, true
	}
	return Policy{}, false
}

// AddPolicy installs p and returns it with its Index assigned. A policy
// with the same selector, direction and IfID must not exist (UpdatePolicy
// replaces one).
func (db *DB) AddPolicy(p Policy) (Policy, error) {
	return db.putPolicy(p, false)
}

// UpdatePolicy replaces the policy with p's selector, direction and IfID,
// keeping its index and age, or installs p if there is none, as
// XFRM_MSG_UPDPOLICY does. It returns the installed policy.
func (db *DB) UpdatePolicy(p Policy) (Policy, error) {
	return db.putPolicy(p, true)
}

func (db *DB) putPolicy(p Policy, replace bool) (Policy, error) {
	if err := p.Validate(); err != nil {
		return Policy{}, err
	}
	p.Selector = p.Selector.normalized()
	s := &db.spdb
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.byID[p.ID().key()]
	switch {
	case old != nil && !replace:
		return Policy{}, fmt.Errorf("sa: %w: %v (UpdatePolicy replaces it)", ErrPolicyExists, p.ID())
	case old == nil:
		idx, err := s.newIndex(p.Dir)
		if err != nil {
			return Policy{}, err
		}
		p.Index = idx
	}
	return s.installLocked(p, old), nil
}

// installLocked installs p, replacing old (keeping its index and age) if
// it is not nil; otherwise p.Index must be a new index. Called with mu
// held.
func (s *spdb) installLocked(p Policy, old *policyEntry) Policy {
	var age uint64
	if old != nil {
		p.Index, age = old.Index, old.rank.lo
		s.spdOf(p.IfID, p.Dir).remove(old)
	} else {
		s.age++
		age = s.age
	}
	e := &policyEntry{Policy: p, rank: rankOf(&p, age)}
	s.byID[p.ID().key()] = e
	s.byIndex[p.Index] = e
	s.spdOf(p.IfID, p.Dir).insert(e)
	if old == nil {
		s.counted(p.IfID, 1)
	}
	return p
}

// deleteLocked removes an installed entry. Called with mu held.
func (s *spdb) deleteLocked(e *policyEntry) {
	delete(s.byID, e.ID().key())
	delete(s.byIndex, e.Index)
	s.spdOf(e.IfID, e.Dir).remove(e)
	s.counted(e.IfID, -1)
}

// newIndex returns an unused index with the direction in its low 3 bits.
func (s *spdb) newIndex(dir Direction) (uint32, error) {
	for range 1 << 29 {
		s.nextIndex += 8
		idx := s.nextIndex | uint32(dir)
		if s.nextIndex != 0 && s.byIndex[idx] == nil {
			return idx, nil
		}
	}
	return 0, errors.New("sa: no free policy index")
}

// DeletePolicy removes the policy id names.
func (db *DB) DeletePolicy(id PolicyID) error {
	s := &db.spdb
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.byID[id.key()]
	if e == nil {
		return fmt.Errorf("sa: policy %v: %w", id, ErrNotFound)
	}
	s.deleteLocked(e)
	return nil
}

// GetPolicy returns the installed policy id names.
func (db *DB) GetPolicy(id PolicyID) (Policy, bool) {
	s := &db.spdb
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.byID[id.key()]; e != nil {
		return e.Policy, true
	}
	return Policy{}, false
}

// Policies returns the installed policies, by direction and then in the
// order in which lookups prefer them.
func (db *DB) Policies() []Policy {
	s := &db.spdb
	s.mu.Lock()
	es := make([]*policyEntry, 0, len(s.byID))
	for _, e := range s.byID {
		es = append(es, e)
	}
	s.mu.Unlock()
	slices.SortFunc(es, func(a, b *policyEntry) int {
		if c := cmp.Compare(a.Dir, b.Dir); c != 0 {
			return c
		}
		return cmpRank(a.rank, b.rank)
	})
	ps := make([]Policy, len(es))
	for i, e := range es {
		ps[i] = e.Policy
	}
	return ps
}

// FlushPolicies removes every policy.
func (db *DB) FlushPolicies() {
	s := &db.spdb
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.dirs {
		d.flush()
	}
	s.ifaces.Store(nil)
	clear(s.byID)
	clear(s.byIndex)
}

// policyCount returns the number of installed policies.
func (s *spdb) policyCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}
