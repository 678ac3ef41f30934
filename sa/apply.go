package sa

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/espd/espd/crypto"
)

// StateID names an installed state: its SPI and outer destination.
type StateID struct {
	SPI uint32
	Dst netip.Addr
}

// PolicyID names an installed policy: its selector, direction and
// interface ID (Policy.IfID).
type PolicyID struct {
	Selector Selector
	Dir      Direction
	IfID     uint32
}

// String returns the policy's identity in the style of ip-xfrm(8).
func (id PolicyID) String() string {
	s := fmt.Sprintf("%v dir %v", id.Selector, id.Dir)
	if id.IfID != 0 {
		s += fmt.Sprintf(" if_id %d", id.IfID)
	}
	return s
}

// Changes are state and policy changes that Apply makes together: a
// configuration reload, for one.
type Changes struct {
	// DeleteSAs are the states to remove; those not installed are
	// ignored.
	DeleteSAs []StateID
	// AddSAs are the states to install once DeleteSAs are gone. A state
	// whose key was a removed state's continues it: an outbound state
	// numbers its packets above the removed one's last sequence number
	// (or its OSeq, if higher), an inbound one keeps its replay window
	// (top and bitmap, carried into the new window if its size or ESN
	// differ, then merged with its ReplaySeq and ReplayBitmap). That is how a
	// state's suite (aes128gcm16 to aes128gcm16-esn or aes128gcm12),
	// reqid or replay window changes without a new key.
	AddSAs []Config
	// UpdateSAs change installed states in place, as UpdateSA does: a
	// higher OSeq raises an outbound state's counter, a ReplaySeq is
	// merged into an inbound state's window.
	UpdateSAs []Config
	// DeletePolicies are the policies to remove; those not installed
	// are ignored.
	DeletePolicies []PolicyID
	// Policies are installed, each replacing the policy with its
	// selector and direction if there is one (as UpdatePolicy).
	Policies []Policy
}

// Apply makes the changes all at once or not at all. It validates every
// state and policy, builds the transforms, checks every clash (SPI and
// destination, inbound SPI, a key used by another state) against the
// database as it will be after the deletions, and reserves the sequence
// numbers of new outbound states in the SeqStore; only then does it
// remove, update and install states and policies, under the database's
// locks, where nothing can fail. If it returns an error, nothing changed
// (a sequence number reservation may have been recorded: that costs
// numbers, never safety).
//
// Lookups (the data path) take no locks and may see the changes land one
// after the other within the commit.
func (db *DB) Apply(ch Changes) error {
	_, err := db.apply(&ch)
	return err
}

// txPlan is what Apply found to do, checked against the database.
type txPlan struct {
	del []*SA // installed states to remove
	upd []*SA // the state each of UpdateSAs changes
	// src is, for each of AddSAs, the removed state it continues: an
	// outbound state whose counter it takes over, or an inbound state
	// whose replay window it keeps; nil for none.
	src []*SA
}

// apply is Apply, returning the installed states of AddSAs in order.
func (db *DB) apply(ch *Changes) ([]*SA, error) {
	for i := range ch.AddSAs {
		if err := ch.AddSAs[i].validate(false); err != nil {
			return nil, err
		}
	}
	for i := range ch.UpdateSAs {
		if err := ch.UpdateSAs[i].validate(true); err != nil {
			return nil, err
		}
	}
	put := make(map[policyID]bool, len(ch.Policies))
	for i := range ch.Policies {
		p := &ch.Policies[i]
		if err := p.Validate(); err != nil {
			return nil, err
		}
		id := p.ID().key()
		if put[id] {
			return nil, fmt.Errorf("sa: policy dir %v %v is given twice", p.Dir, p.Selector)
		}
		put[id] = true
	}
	adds := make([]*SA, len(ch.AddSAs))
	committed := false
	defer func() {
		if !committed {
			for _, s := range adds {
				if s != nil {
					s.discard()
				}
			}
		}
	}()
	for i := range ch.AddSAs {
		s, err := db.newSA(&ch.AddSAs[i])
		if err != nil {
			return nil, err
		}
		adds[i] = s
	}

	db.keying.Lock()
	defer db.keying.Unlock()
	d := &db.sadb
	d.mu.Lock()
	pl, err := db.plan(ch, adds)
	d.mu.Unlock()
	if err != nil {
		return nil, err
	}
	// New keys: read their record and reserve their first block above
	// it and above the requested floor (OSeq). Holding keying, no other
	// state of these keys can appear meanwhile. A state that continues
	// another, or an update, with a floor above its key's numbers gets a
	// reservation above the floor now, recorded before commit raises its
	// counter to it. Inbound keys are recorded as such (useInbound).
	floors := make([]uint64, len(adds))
	for i, s := range adds {
		if s.dir != DirOut {
			if err := db.useInbound(s); err != nil {
				return nil, err
			}
			continue
		}
		floor := ch.AddSAs[i].OSeq
		if pl.src[i] == nil {
			if err := db.resumeSeq(s, floor); err != nil {
				return nil, err
			}
		} else if floor > 0 {
			lim, err := db.reserveFloor(s, pl.src[i], floor)
			if err != nil {
				return nil, err
			}
			floors[i] = lim
		}
	}
	updFloors := make([]uint64, len(pl.upd))
	for i, s := range pl.upd {
		if floor := ch.UpdateSAs[i].OSeq; s.dir == DirOut && floor > s.seqUsed.Load() {
			lim, err := db.reserveFloor(s, s, floor)
			if err != nil {
				return nil, err
			}
			updFloors[i] = lim
		}
	}

	d.mu.Lock()
	sp := &db.spdb
	sp.mu.Lock()
	// Check again, authoritatively: the data path and the lifetime
	// ticker may have removed states meanwhile (not added any: that
	// takes keying).
	pl2, err := db.plan(ch, adds)
	if err == nil {
		for i := range adds {
			if (pl.src[i] == nil) != (pl2.src[i] == nil) {
				err = fmt.Errorf("sa: state spi 0x%08x: the states of its key changed while the change was prepared; try again", adds[i].spi)
				break
			}
		}
	}
	var pols []polChange
	if err == nil {
		pols, err = sp.planPolicies(ch)
	}
	if err != nil {
		sp.mu.Unlock()
		d.mu.Unlock()
		return nil, err
	}
	removed := db.commit(ch, pl2, adds, floors, updFloors)
	sp.commitPolicies(ch, pols)
	committed = true
	sp.mu.Unlock()
	d.mu.Unlock()

	db.retireAll(removed)
	for _, s := range slices.Concat(adds, pl2.upd) {
		if s.dir == DirOut && s.seqUsed.Load() >= s.seqExtAt.Load() {
			s.extendSeq()
		}
	}
	return adds, nil
}

// plan checks ch against the database as it will be after the deletions
// and finds the states each change is about. Called with keying and
// sadb.mu held; it changes nothing.
func (db *DB) plan(ch *Changes, adds []*SA) (*txPlan, error) {
	d := &db.sadb
	pl := &txPlan{upd: make([]*SA, len(ch.UpdateSAs)), src: make([]*SA, len(adds))}
	gone := make(map[*SA]bool)
	for _, id := range ch.DeleteSAs {
		if s, ok := d.byKey.get(stateKey(id.SPI, id.Dst.Unmap())); ok && !gone[s] {
			gone[s] = true
			pl.del = append(pl.del, s)
		}
	}
	// after holds the (SPI, dst) pairs whose occupant changes: nil for
	// one that becomes free.
	after := make(map[saKey]*SA)
	for _, s := range pl.del {
		after[stateKey(s.spi, s.params.Load().cfg.Dst)] = nil
	}
	occupant := func(k saKey) *SA {
		if s, ok := after[k]; ok {
			return s
		}
		s, _ := d.byKey.get(k)
		return s
	}

	for i := range ch.UpdateSAs {
		c := &ch.UpdateSAs[i]
		s, err := d.findForUpdate(c, gone)
		if err != nil {
			return nil, err
		}
		if err := s.checkUpdate(c); err != nil {
			return nil, err
		}
		oldKey, newKey := stateKey(s.spi, s.params.Load().cfg.Dst), stateKey(s.spi, c.Dst.Unmap())
		if newKey != oldKey {
			if o := occupant(newKey); o != nil && o != s {
				return nil, fmt.Errorf("sa: state spi 0x%08x dst %v: %w", s.spi, c.Dst, ErrStateExists)
			}
			if occupant(oldKey) == s {
				after[oldKey] = nil
			}
			after[newKey] = s
		}
		pl.upd[i] = s
	}

	inSPI := make(map[uint32]*SA)
	byFP := make(map[crypto.Fingerprint]*SA)
	for i, s := range adds {
		c := &s.params.Load().cfg
		k := stateKey(s.spi, c.Dst)
		if occupant(k) != nil {
			return nil, fmt.Errorf("sa: state spi 0x%08x dst %v: %w (delete it first or use UpdateSA)", s.spi, c.Dst, ErrStateExists)
		}
		after[k] = s
		if s.dir == DirIn {
			o, ok := d.inbound.get(u32Key(s.spi))
			if !ok || gone[o] {
				o = inSPI[s.spi]
			}
			if o != nil {
				return nil, kindErrorf(ErrStateExists, "sa: inbound SPI 0x%08x is in use by the state to %v", s.spi, o.params.Load().cfg.Dst)
			}
			inSPI[s.spi] = s
		}
		if o := byFP[s.fp]; o != nil {
			return nil, keyInUse(s, o)
		}
		byFP[s.fp] = s
		e := d.keys[s.fp]
		if e == nil {
			continue
		}
		if e.live != nil && !gone[e.live] {
			if db.opts.Loopback && e.live.spi == s.spi && e.live.dir != s.dir {
				continue
			}
			return nil, keyInUse(s, e.live)
		}
		if err := pl.continues(i, s, e, gone); err != nil {
			return nil, err
		}
	}
	return pl, nil
}

// keyInUse is the error for a state whose key o already has.
func keyInUse(s, o *SA) error {
	return kindErrorf(ErrKeyReuse, "sa: state spi 0x%08x dir %v: key already in use by state spi 0x%08x dir %v; every SA needs its own key", s.spi, s.dir, o.spi, o.dir)
}

// continues finds the removed state that the new state s (adds[i])
// continues, from its key's entry, and checks that s can continue it.
func (pl *txPlan) continues(i int, s *SA, e *keyEntry, gone map[*SA]bool) error {
	var src *SA
	if e.live != nil && gone[e.live] && e.live.dir != s.dir {
		return kindErrorf(ErrKeyReuse, "sa: state spi 0x%08x dir %v: its key is that of state spi 0x%08x dir %v, which it replaces; a key cannot change direction (both ends would number packets under it): use a new key", s.spi, s.dir, e.live.spi, e.live.dir)
	}
	if e.live != nil && gone[e.live] {
		src = e.live
	} else if s.dir == DirOut && e.retiring != nil {
		src = e.retiring
	}
	if src == nil {
		return nil
	}
	if s.dir == DirOut && !s.params.Load().cfg.Negotiated && src.params.Load().cfg.Negotiated {
		// Its key's record would stay negotiated, which may expire.
		return &FieldError{Field: FieldNegotiated, Err: kindErrorf(ErrKeyReuse, "sa: state spi 0x%08x: its key is that of state spi 0x%08x, negotiated by IKE, which it continues as a manually keyed state; a negotiated key must not be installed by hand (its sequence numbers are forgotten after the store's retention): use a new key", s.spi, src.spi)}
	}
	if s.dir == DirOut {
		// The most src may have sent: its last number once sealed, its
		// reservation while it is still live.
		bound := src.seqFinal
		if src.State() != StateDead {
			bound = min(src.seqLimit.Load(), src.seqMax)
		}
		if bound >= s.seqMax {
			return kindErrorf(ErrKeyReuse, "sa: state spi 0x%08x: its key continues state spi 0x%08x, which may have sent sequence numbers up to %d, more than %v can number; keep ESN on or use a new key", s.spi, src.spi, bound, s.suite)
		}
	} else if !s.suite.ESN {
		// Leave room for the peer to go on while the change commits.
		if top := src.ReplayTop(); top >= 1<<32-1<<20 {
			return kindErrorf(ErrKeyReuse, "sa: state spi 0x%08x: its key continues state spi 0x%08x, whose peer has sent sequence numbers up to %d; without ESN they would start again: keep ESN on or use a new key", s.spi, src.spi, top)
		}
	}
	pl.src[i] = src
	return nil
}

// polChange is one planned policy change: e the installed entry it
// replaces or removes (nil for none), p the policy to install (index
// assigned) unless del.
type polChange struct {
	e   *policyEntry
	p   Policy
	del bool
}

// planPolicies checks the policy changes and assigns the indexes of new
// policies. Called with spdb.mu held; it changes nothing but the index
// generator.
func (s *spdb) planPolicies(ch *Changes) ([]polChange, error) {
	var out []polChange
	put := make(map[policyID]bool)
	for _, p := range ch.Policies {
		p.Selector = p.Selector.normalized()
		id := p.ID().key()
		if put[id] {
			return nil, fmt.Errorf("sa: policy dir %v %v is given twice", p.Dir, p.Selector)
		}
		put[id] = true
		e := s.byID[id]
		if e == nil {
			idx, err := s.newIndex(p.Dir)
			if err != nil {
				return nil, err
			}
			p.Index = idx
		}
		out = append(out, polChange{e: e, p: p})
	}
	for _, id := range ch.DeletePolicies {
		pid := id.key()
		if e := s.byID[pid]; e != nil && !put[pid] {
			put[pid] = true
			out = append(out, polChange{e: e, del: true})
		}
	}
	return out, nil
}
