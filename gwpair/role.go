package gwpair

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/metrics"
	"github.com/espd/espd/pairsync"
	"github.com/espd/espd/sa"
)

// Role sets (role != 0) or reads this node's role (PAIR_ROLE).
// Becoming active merges the windows the other node reported into the
// inbound states and releases each silent outbound state above its
// key's fresh report (sa.DB.Activate); a key without one stays silent
// and is soft-expired, so charon rekeys it. Becoming standby silences
// every outbound state. A read answers during a takeover.
func (p *Pair) Role(role wire.PairRole) (wire.PairStatus, error) {
	switch role {
	case wire.PairRoleNone:
	case wire.PairRoleActive:
		p.roleMu.Lock()
		if p.node.Role() != pairsync.RoleActive || p.db.Standby() {
			p.node.SetRole(pairsync.RoleActive)
			p.activate()
		}
		p.roleMu.Unlock()
	case wire.PairRoleStandby:
		p.roleMu.Lock()
		p.db.SetStandby(true)
		p.node.SetRole(pairsync.RoleStandby)
		p.setCounts(0, 0, 0)
		p.roleMu.Unlock()
	default:
		return wire.PairStatus{}, wire.Errorf(wire.EINVAL, "pair role %d: want active (1) or standby (2)", role)
	}
	released, silent, _ := p.counts()
	st := wire.PairStatus{Node: uint32(p.num), Role: wire.PairRoleStandby, Released: uint32(released), Silent: uint32(silent)}
	if p.node.Role() == pairsync.RoleActive {
		st.Role = wire.PairRoleActive
	}
	if ago, ok := p.node.PeerHeard(); ok {
		st.PeerHeardMs = max(uint64(ago.Milliseconds()), 1)
	}
	return st, nil
}

// activate takes over: windows first (replays are refused from the
// first packet), then the outbound states. An inbound state whose
// window no fresh report gave (FreshWindow: lost, dropped or delayed
// Windows messages, or a state the old active had not yet reported)
// still gets every window reported, which only refuses more, but the
// replay bound of docs/ha.md does not hold for it: it is soft-expired,
// so that charon rekeys it, and counted (espd_pair_takeover_stale_windows).
// Called with p.roleMu held.
func (p *Pair) activate() {
	stale := 0
	for _, s := range p.db.SAs() {
		if s.Dir() != sa.DirIn || !s.Alive() {
			continue
		}
		w, fresh := p.node.FreshWindow(s.Fingerprint())
		if w.Top != 0 || len(w.Bitmap) != 0 {
			s.MergeReplay(w.Top, w.Bitmap)
		}
		if !fresh {
			stale++
			if p.db.RekeyInbound(s) {
				p.log.Warn("takeover: no fresh replay window report for an inbound state: it is rekeyed", "spi", fmt.Sprintf("0x%08x", s.SPI()))
			}
		}
	}
	p.setCounts(0, 0, stale)
	p.release(p.node.Report, "takeover", false)
	released, silent, _ := p.counts()
	p.log.Info("pair role active", "released", released, "silent", silent, "stale_windows", stale)
}

// release runs sa.DB.Activate with report on the silent outbound states,
// counting what it released and what stays silent; how names the
// release in the log, and a quiet one logs only releases. Called with
// p.roleMu held.
func (p *Pair) release(report func(crypto.Fingerprint) (uint64, bool), how string, quiet bool) {
	silent, released := 0, 0
	for _, a := range p.db.Activate(report) {
		spi := fmt.Sprintf("0x%08x", a.SA.SPI())
		if a.Err != nil {
			silent++
			if !quiet {
				p.log.Warn(how+": state stays silent until a fresh report of its key arrives or it is rekeyed", "spi", spi, "err", a.Err)
			}
			continue
		}
		released++
		p.log.Info(how+": state continues", "spi", spi, "above", a.Floor)
	}
	p.mu.Lock()
	p.released += released
	p.silent = silent
	p.mu.Unlock()
}

// RetryRelease, until ctx is done and while the node is active, releases every Interval the
// outbound states still silent (their keys had no fresh report at the
// takeover, or they were added silent since) once a fresh report of
// their key arrives: the other node's own reservations, at a first start
// where neither was active before, or after espd restarted.
func (p *Pair) RetryRelease(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.roleMu.Lock()
		if _, silent, _ := p.counts(); p.node.Role() == pairsync.RoleActive && silent > 0 {
			p.release(p.node.Report, "takeover", true)
		}
		p.roleMu.Unlock()
	}
}

// ApplyRoleFile gives the node the role recorded in path, Options.RoleFile
// (the notify script writes it before it calls espctl pair role), so that
// an espd restarted on the active node takes its part again; without the
// file it stands by. Restarted active, a state still silent after the
// lease (no fresh report: the other node is down) continues above this
// node's own durable record, which holds every report the other node
// made while this one was active; the other node could only have sent
// more in its own blocks by becoming active meanwhile, which VRRP
// prevents while this node's keepalived stayed master. lease is
// Options.Lease; the release runs until ctx is done.
func (p *Pair) ApplyRoleFile(ctx context.Context, path string, lease time.Duration) {
	if path == "" {
		return
	}
	b, err := readRoleFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		p.log.Warn("pair role file: standing by", "path", path, "err", err)
		return
	}
	switch r := strings.TrimSpace(string(b)); r {
	case "active":
		p.log.Info("pair role file says active", "path", path)
		p.Role(wire.PairRoleActive)
		go p.releaseOwn(ctx, cmp.Or(lease, pairsync.DefaultLease)*11/10)
	case "standby":
	default:
		p.log.Warn("pair role file: want active or standby: standing by", "path", path, "content", r)
	}
}

// releaseOwn waits wait, then releases the states still silent above
// their own record (ApplyRoleFile).
func (p *Pair) releaseOwn(ctx context.Context, wait time.Duration) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	p.roleMu.Lock()
	defer p.roleMu.Unlock()
	if _, silent, _ := p.counts(); p.node.Role() != pairsync.RoleActive || silent == 0 {
		return
	}
	if p.node.Conflict() {
		p.log.Error("restarted active: the other node is alive but misconfigured (espd_pair_misconfigured_total): the states stay silent")
		return
	}
	p.release(func(crypto.Fingerprint) (uint64, bool) { return 0, true },
		"restarted active without a fresh report from the other node, above this node's own record", false)
}

// Metrics returns what the pair's series export (metrics.Sources.Pair);
// it waits for no takeover.
func (p *Pair) Metrics() metrics.Pair {
	heard, ok := p.node.PeerHeard()
	m := metrics.Pair{Role: p.node.Role(), Heard: heard, HeardOK: ok, Link: p.node.Stats()}
	m.Released, m.Silent, m.Stale = p.counts()
	return m
}
