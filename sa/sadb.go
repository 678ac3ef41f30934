package sa

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
)

// newTransform builds transforms; tests wrap it to watch Zero.
var newTransform = crypto.New

// sadb is the state half of DB.
type sadb struct {
	mu         sync.Mutex
	byKey      *lfTable[saKey, *SA]  // installed states by (SPI, dst)
	inbound    *lfTable[u32Key, *SA] // installed inbound states by SPI
	outByReqID *lfTable[u32Key, *SA] // newest live outbound state per reqid
	reqids     map[uint32][]*SA      // live outbound states per reqid, oldest first
	larval     map[uint32]*SA        // AllocSPI reservations
	keys       map[crypto.Fingerprint]*keyEntry
	addSeq     uint64
	retired    totals // counters of removed states

	// installed lists the installed states in no order (s.installedAt
	// is s's index), so that Stats, SAs and the lifetime ticker copy
	// the list under mu, one memmove, and read the states after
	// releasing it.
	installed []*SA
}

func (d *sadb) init() {
	d.byKey = newLFTable[saKey, *SA]()
	d.inbound = newLFTable[u32Key, *SA]()
	d.outByReqID = newLFTable[u32Key, *SA]()
	d.reqids = make(map[uint32][]*SA)
	d.larval = make(map[uint32]*SA)
	d.keys = make(map[crypto.Fingerprint]*keyEntry)
}

// LookupInbound returns the installed inbound state with this SPI, or nil.
// It takes no lock and does not allocate.
func (db *DB) LookupInbound(spi uint32) *SA {
	s, _ := db.sadb.inbound.get(u32Key(spi))
	return s
}

// GetSA returns the installed state with this SPI and outer destination.
// It takes no lock and does not allocate.
func (db *DB) GetSA(spi uint32, dst netip.Addr) (*SA, bool) {
	return db.sadb.byKey.get(stateKey(spi, dst.Unmap()))
}

// OutboundSA returns the newest live outbound state of the reqid, or nil.
// While the IKE daemon rekeys, the new state is installed before the old
// one is deleted; traffic moves to the new one at once. It takes no lock
// and does not allocate.
func (db *DB) OutboundSA(reqid uint32) *SA {
	s, _ := db.sadb.outByReqID.get(u32Key(reqid))
	return s
}

// AddSA installs a state. It builds the crypto.Transform and the
// esp.Encapsulator (DirOut) or the esp.Decapsulator with its ReplayWindow
// (DirIn). An inbound SPI must be unused by other inbound states; AddSA
// consumes an AllocSPI reservation of it. The key must be no other live
// state's, whatever its direction. An outbound state continues above the
// sequence numbers its key may have sent (SeqStore), and AddSA fails if
// that cannot be known or reserved.
func (db *DB) AddSA(c Config) (*SA, error) {
	ss, err := db.apply(&Changes{AddSAs: []Config{c}})
	if err != nil {
		return nil, err
	}
	return ss[0], nil
}

// newSA builds a state from a validated config, not yet installed.
func (db *DB) newSA(c *Config) (*SA, error) {
	t, err := newTransform(c.Suite, c.EncKey, c.IntegKey)
	if err != nil {
		return nil, fmt.Errorf("sa: state spi 0x%08x: %w", c.SPI, err)
	}
	s := &SA{
		db:        db,
		spi:       c.SPI,
		dir:       c.Dir,
		suite:     c.Suite,
		reqid:     c.ReqID,
		ifID:      c.IfID,
		mode:      c.Mode,
		seqMax:    seqMaxOf(c.Suite),
		transform: t,
		fp:        crypto.KeyFingerprint(c.EncKey, c.IntegKey),
	}
	if db.opts.PairNode != 0 {
		local := c.Src
		if c.Dir == DirIn {
			local = c.Dst
		}
		if db.opts.PairLocal == nil || !db.opts.PairLocal(local) {
			s.pairNode = db.opts.PairNode
		}
	}
	p := &params{cfg: c.public()}
	s.params.Store(p)
	s.publishCodec(p, nil)
	return s, nil
}

// publishCodec publishes the encapsulator or decapsulator for p, keeping
// the replay window of old.
func (s *SA) publishCodec(p *params, old *esp.Decapsulator) {
	if s.dir == DirOut {
		s.enc.Store(&esp.Encapsulator{SPI: s.spi, Transform: s.transform, Outer: p.cfg.outer(), TFCPadTo: p.cfg.TFCPadTo})
		return
	}
	var rw *esp.ReplayWindow
	if old != nil {
		rw = old.Replay
	} else {
		// Size 0 turns checking off but still tracks the highest sequence
		// number, for ESN inference and ReplayTop.
		rw = esp.NewReplayWindow(p.cfg.ReplayWindow, s.suite.ESN)
	}
	s.dec.Store(&esp.Decapsulator{Transform: s.transform, Replay: rw, ECN: p.cfg.ECN, UDPEncap: p.cfg.EncapDstPort != 0})
}

// UpdateSA changes an installed state's endpoints, UDP encapsulation
// ports, lifetimes, selectors and outer options, keeping its sequence
// numbers, replay window and counters. The state is the one with c's SPI,
// direction and destination, or, if the destination is what changes, the
// only one with c's SPI, direction and reqid. Keys (nil means unchanged),
// algorithms (ESN included), reqid, interface ID and replay window size cannot change
// (a *FieldError names which was given): replace the state instead (Apply with the state in DeleteSAs and the new one in
// AddSAs keeps its counters when the key stays). A higher OSeq raises an
// outbound state's counter (reserved in the SeqStore first), a ReplaySeq
// and ReplayBitmap are merged into an inbound state's window; neither
// ever lowers anything.
func (db *DB) UpdateSA(c Config) error {
	_, err := db.apply(&Changes{UpdateSAs: []Config{c}})
	return err
}

// checkUpdate reports why c cannot update s in place: a *FieldError
// naming the setting that cannot change.
func (s *SA) checkUpdate(c *Config) error {
	old := s.params.Load()
	esnOnly := c.Suite
	esnOnly.ESN = s.suite.ESN
	switch {
	case c.Suite != s.suite && esnOnly == s.suite:
		return immutable(FieldESN, "sa: state spi 0x%08x: UpdateSA cannot turn ESN %s (%v to %v): a state's sequence numbers keep their width; delete the state and add a new one", s.spi, onOff(c.Suite.ESN), s.suite, c.Suite)
	case c.Suite != s.suite:
		return immutable(FieldSuite, "sa: state spi 0x%08x: UpdateSA cannot change the algorithms (%v to %v): delete the state and add a new one", s.spi, s.suite, c.Suite)
	case (c.EncKey != nil || c.IntegKey != nil) && crypto.KeyFingerprint(c.EncKey, c.IntegKey) != s.fp:
		return immutable(FieldKeys, "sa: state spi 0x%08x: UpdateSA cannot change the keys: delete the state and add a new one", s.spi)
	case c.ReqID != s.reqid:
		return immutable(FieldReqID, "sa: state spi 0x%08x: UpdateSA cannot change the reqid (%d to %d): delete the state and add a new one", s.spi, s.reqid, c.ReqID)
	case c.Mode != old.cfg.Mode:
		return immutable(FieldMode, "sa: state spi 0x%08x: UpdateSA cannot change the mode (%v to %v): delete the state and add a new one", s.spi, old.cfg.Mode, c.Mode)
	case c.IfID != s.ifID:
		return immutable(FieldIfID, "sa: state spi 0x%08x: UpdateSA cannot change the interface ID (%d to %d): delete the state and add a new one", s.spi, s.ifID, c.IfID)
	case s.dir == DirIn && c.ReplayWindow != old.cfg.ReplayWindow:
		return immutable(FieldReplayWindow, "sa: state spi 0x%08x: UpdateSA cannot change the replay window (%d to %d): delete the state and add a new one", s.spi, old.cfg.ReplayWindow, c.ReplayWindow)
	case c.Negotiated != old.cfg.Negotiated:
		return immutable(FieldNegotiated, "sa: state spi 0x%08x: UpdateSA cannot change whether its keys were negotiated (%s to %s): the origin of a key decides how long its sequence numbers are remembered; delete the state and add a new one with a new key", s.spi, origin(old.cfg.Negotiated), origin(c.Negotiated))
	}
	return nil
}

// publishUpdate publishes s's new parameters, keeping its replay window.
func (s *SA) publishUpdate(p *params) {
	s.params.Store(p)
	s.publishCodec(p, s.dec.Load())
}

// findForUpdate finds the state UpdateSA means. Called with d.mu held.
// States in gone (Apply's deletions) are not candidates.
func (d *sadb) findForUpdate(c *Config, gone map[*SA]bool) (*SA, error) {
	if s, ok := d.byKey.get(stateKey(c.SPI, c.Dst.Unmap())); ok && s.dir == c.Dir && !gone[s] {
		return s, nil
	}
	var cands []*SA
	if c.Dir == DirIn {
		if s, ok := d.inbound.get(u32Key(c.SPI)); ok && s.reqid == c.ReqID && !gone[s] {
			cands = append(cands, s)
		}
	} else {
		for _, s := range d.reqids[c.ReqID] {
			if s.spi == c.SPI && !gone[s] {
				cands = append(cands, s)
			}
		}
	}
	switch len(cands) {
	case 0:
		return nil, fmt.Errorf("sa: state spi 0x%08x dir %v dst %v reqid %d: %w", c.SPI, c.Dir, c.Dst, c.ReqID, ErrNotFound)
	case 1:
		return cands[0], nil
	}
	return nil, fmt.Errorf("sa: %d outbound states have spi 0x%08x and reqid %d: give the current destination", len(cands), c.SPI, c.ReqID)
}

// DeleteSA removes the state with this SPI and outer destination (or the
// SPI reservation, whatever dst), zeroing its keys, and records an
// outbound state's last sequence number in the SeqStore. It fires no
// event.
func (db *DB) DeleteSA(spi uint32, dst netip.Addr) error {
	db.keying.Lock()
	defer db.keying.Unlock()
	d := &db.sadb
	d.mu.Lock()
	s, ok := d.byKey.get(stateKey(spi, dst.Unmap()))
	if !ok {
		defer d.mu.Unlock()
		if l := d.larval[spi]; l != nil {
			delete(d.larval, spi)
			l.state.Store(uint32(StateDead))
			return nil
		}
		return fmt.Errorf("sa: state spi 0x%08x dst %v: %w", spi, dst, ErrNotFound)
	}
	db.removeLocked(s)
	d.mu.Unlock()
	db.retireAll([]*SA{s})
	return nil
}

// SAs returns the installed states and SPI reservations, in the order
// they were added.
func (db *DB) SAs() []*SA {
	d := &db.sadb
	d.mu.Lock()
	ss := d.snapshotInstalled(make([]*SA, 0, len(d.installed)+len(d.larval)))
	for _, s := range d.larval {
		ss = append(ss, s)
	}
	d.mu.Unlock()
	slices.SortFunc(ss, func(a, b *SA) int { return cmp.Compare(a.addSeq, b.addSeq) })
	return ss
}

// FlushSAs removes every state and SPI reservation, zeroing their keys
// and recording the last sequence number of each outbound state in the
// SeqStore. It fires no events.
func (db *DB) FlushSAs() {
	db.keying.Lock()
	defer db.keying.Unlock()
	d := &db.sadb
	d.mu.Lock()
	var ss []*SA
	d.byKey.all(func(_ saKey, s *SA) bool { ss = append(ss, s); return true })
	for _, s := range ss {
		db.removeLocked(s)
	}
	for spi, l := range d.larval {
		l.state.Store(uint32(StateDead))
		delete(d.larval, spi)
	}
	d.mu.Unlock()
	db.retireAll(ss)
}

// hardExpire removes s and fires a hard-expire event, unless it is
// already dead. It may be called from the data path: it retires the
// state in the SeqStore from another goroutine.
func (db *DB) hardExpire(s *SA, r ExpireReason) {
	if s.State() == StateDead {
		return
	}
	d := &db.sadb
	d.mu.Lock()
	removed := s.State() != StateDead
	if removed {
		db.removeLocked(s)
	}
	d.mu.Unlock()
	if removed {
		db.retireLater(s)
		db.publish(s.expireEvent(EventHardExpire, r, db))
	}
}

// softExpire marks s soft-expired and fires a soft-expire event, once.
func (db *DB) softExpire(s *SA, r ExpireReason) {
	if s.state.CompareAndSwap(uint32(StateValid), uint32(StateSoftExpired)) {
		db.publish(s.expireEvent(EventSoftExpire, r, db))
	}
}

// removeLocked takes s out of every index, marks it dead, seals an
// outbound state's sequence numbers (its key's record then waits for
// retire, or for a new state of the same key to take over), and zeroes
// its transform now if no batch holds the state, else at the last
// Release. Called with sadb.mu held.
func (db *DB) removeLocked(s *SA) {
	d := &db.sadb
	s.state.Store(uint32(StateDead))
	k := stateKey(s.spi, s.params.Load().cfg.Dst)
	if o, _ := d.byKey.get(k); o == s {
		d.byKey.remove(k)
	}
	if s.dir == DirIn {
		if o, _ := d.inbound.get(u32Key(s.spi)); o == s {
			d.inbound.remove(u32Key(s.spi))
		}
	} else {
		list := slices.DeleteFunc(d.reqids[s.reqid], func(o *SA) bool { return o == s })
		if len(list) == 0 {
			delete(d.reqids, s.reqid)
			d.outByReqID.remove(u32Key(s.reqid))
		} else {
			d.reqids[s.reqid] = list
			d.outByReqID.put(u32Key(s.reqid), list[len(list)-1])
		}
	}
	if e := s.key; e != nil {
		if e.live == s {
			e.live = nil
		}
		if s.dir == DirOut {
			s.sealSeq()
			e.retiring = s
		} else if e.live == nil && e.retiring == nil && d.keys[s.fp] == e {
			delete(d.keys, s.fp)
		}
	}
	d.uninstall(s)
	// Stats reads the counters of a state that it finds dead from here:
	// it was dead before these were read (see statsOf).
	t := new(totals)
	t.add(s)
	s.final.Store(t)
	d.retired.addTotals(t)
	s.kill()
}

// uninstall takes s out of the installed list. Called with sadb.mu held.
func (d *sadb) uninstall(s *SA) {
	i := s.installedAt
	if i >= len(d.installed) || d.installed[i] != s {
		return
	}
	last := len(d.installed) - 1
	d.installed[i] = d.installed[last]
	d.installed[i].installedAt = i
	d.installed[last] = nil
	d.installed = d.installed[:last]
	if c := cap(d.installed); c > 1024 && last < c/4 {
		d.installed = append(make([]*SA, 0, 2*last), d.installed...)
	}
}

// snapshotInstalled appends the installed states to buf. Called with
// sadb.mu held.
func (d *sadb) snapshotInstalled(buf []*SA) []*SA {
	return append(buf, d.installed...)
}

// discard erases the key material of a state that was built but not
// installed (nobody can hold it), and gives back its SeqStore count of
// an inbound key (the record that the key served inbound stays).
func (s *SA) discard() {
	if s.inRecorded {
		s.inRecorded = false
		if err := s.db.seqOf(s).RetireInbound(s.fp); err != nil {
			s.db.seqError(fmt.Errorf("sa: state spi 0x%08x (not installed): %w", s.spi, err))
		}
	}
	s.transform.Zero()
}
