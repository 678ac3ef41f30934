package sa

// commit makes the planned state changes. Called with keying, sadb.mu
// and spdb.mu held; it cannot fail. It returns the removed states.
// floors and updFloors hold, for each of adds and of pl.upd, the durable
// reservation made above the OSeq they carry (0: none was needed).
func (db *DB) commit(ch *Changes, pl *txPlan, adds []*SA, floors, updFloors []uint64) []*SA {
	d := &db.sadb
	for _, s := range pl.del {
		db.removeLocked(s)
	}
	// Updates that move a state to another destination: take every moved
	// state out of byKey first, so that moves may chain.
	ps := make([]*params, len(pl.upd))
	for i, s := range pl.upd {
		ps[i] = &params{cfg: ch.UpdateSAs[i].public()}
		if k := stateKey(s.spi, s.params.Load().cfg.Dst); k != stateKey(s.spi, ps[i].cfg.Dst) {
			if o, _ := d.byKey.get(k); o == s {
				d.byKey.remove(k)
			}
		}
	}
	for i, s := range pl.upd {
		d.byKey.put(stateKey(s.spi, ps[i].cfg.Dst), s)
		s.publishUpdate(ps[i])
		c := &ch.UpdateSAs[i]
		if s.dir == DirOut && updFloors[i] != 0 {
			db.raiseSeq(s, c.OSeq, updFloors[i])
		}
		if s.dir == DirIn && c.ReplaySeq != 0 {
			s.dec.Load().Replay.Merge(c.ReplaySeq, c.ReplayBitmap)
		}
	}
	for i, s := range adds {
		src := pl.src[i]
		e := d.keys[s.fp]
		if e == nil {
			e = &keyEntry{}
			d.keys[s.fp] = e
		}
		if e.live != nil && s.dir == DirIn {
			// Options.Loopback: the inbound twin of a live outbound
			// state; the outbound state keeps the key's record.
			e = &keyEntry{}
		}
		c := &ch.AddSAs[i]
		switch {
		case s.dir == DirOut && src != nil:
			// src is sealed: continue from its exact last number, or the
			// floor if higher, within its reservation or the floor's,
			// and take over its key's record (a pending retire of src
			// now does nothing).
			used, limit := src.seqFinal, src.seqSealed
			if floors[i] != 0 && c.OSeq > used {
				used, limit = c.OSeq, max(limit, floors[i])
			}
			db.startSeq(s, used, limit)
			if src.silent.Load() {
				// Its key's numbers are as unknown as src's were.
				s.silent.Store(true)
			}
			e.retiring = nil
		case s.dir == DirIn && src != nil:
			s.continueReplay(src)
		}
		if s.dir == DirIn && c.ReplaySeq != 0 {
			s.dec.Load().Replay.Merge(c.ReplaySeq, c.ReplayBitmap)
		}
		e.live = s
		s.key = e
		db.installLocked(s)
	}
	return pl.del
}

// continueReplay gives the new inbound state s the replay state of src,
// which it replaces under the same key: the very window if its size and
// ESN are the same, else a copy carried into s's window.
func (s *SA) continueReplay(src *SA) {
	old := src.dec.Load().Replay
	dec := s.dec.Load()
	rw := dec.Replay
	if rw.Size() == old.Size() && rw.ESN() == old.ESN() {
		rw = old
	} else {
		rw.Continue(old)
	}
	next := *dec
	next.Replay = rw
	s.dec.Store(&next)
}

// installLocked publishes a new state in the indexes. Called with
// sadb.mu held.
func (db *DB) installLocked(s *SA) {
	d := &db.sadb
	if s.dir == DirIn {
		delete(d.larval, s.spi)
	}
	d.addSeq++
	s.addSeq = d.addSeq
	s.addTime = db.mono()
	s.state.Store(uint32(StateValid))
	if s.dir == DirOut && s.pairNode != 0 && db.standby.Load() {
		s.silent.Store(true)
	}
	s.installedAt = len(d.installed)
	d.installed = append(d.installed, s)
	d.byKey.put(stateKey(s.spi, s.params.Load().cfg.Dst), s)
	if s.dir == DirIn {
		d.inbound.put(u32Key(s.spi), s)
	} else {
		d.reqids[s.reqid] = append(d.reqids[s.reqid], s)
		d.outByReqID.put(u32Key(s.reqid), s)
	}
}

// commitPolicies makes the planned policy changes. Called with spdb.mu
// held; it cannot fail.
func (s *spdb) commitPolicies(_ *Changes, pols []polChange) {
	for _, c := range pols {
		if c.del {
			s.deleteLocked(c.e)
		}
	}
	for _, c := range pols {
		if !c.del {
			s.installLocked(c.p, c.e)
		}
	}
}
