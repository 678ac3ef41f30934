package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/config"
	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/pairsync"
	"github.com/espd/espd/sa"
)

// PairOptions make espd one node of an active/standby gateway pair
// (docs/ha.md). Node 0: no pair.
type PairOptions struct {
	Node int // 1 or 2: which sequence blocks this node numbers from
	// Listen and Peer are the pair link's UDP addresses (host:port) of
	// this node and of the other.
	Listen, Peer string
	// KeyFile holds the pair's key, 64 hex digits (readPairKey).
	KeyFile string
	// Interval and Lease: pairsync.Config's (0: its defaults).
	Interval, Lease time.Duration
	// LocalAddrs are this node's own addresses (the sync link's): a state
	// whose local address is one of them belongs to this node alone, as
	// the ha plugin's tunnel between the nodes does (sa.Options.PairLocal).
	LocalAddrs []netip.Addr
	// Mark is the SO_MARK of the pair link's socket, so that its packets
	// skip the routes into the TUN (IO.Mark).
	Mark uint32
	// RoleFile, if set, holds the role ("active" or "standby") that the
	// node takes when espd starts (applyRoleFile).
	RoleFile string
}

// pair is the daemon's part in a gateway pair.
type pair struct {
	node  *pairsync.Node
	store sa.SeqStore // the node's own store, which node wraps
	num   int
	log   *slog.Logger

	// roleMu serializes role changes and releases; it is held through a
	// takeover (sa.DB.Activate), so that status requests and metrics,
	// which take mu only, answer meanwhile.
	roleMu sync.Mutex
	mu     sync.Mutex // guards the counts of the last takeover
	// released and silent count outbound states, stale inbound ones
	// whose replay window no fresh report gave (activate).
	released, silent, stale int
}

// counts returns the last takeover's counts.
func (p *pair) counts() (released, silent, stale int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.released, p.silent, p.stale
}

// setCounts sets them.
func (p *pair) setCounts(released, silent, stale int) {
	p.mu.Lock()
	p.released, p.silent, p.stale = released, silent, stale
	p.mu.Unlock()
}

// readPairKey reads the pair's key from path: 32 bytes in hex, not all
// zero, in a key file as config.OpenKeyFile checks it (not a symbolic link,
// a regular file, owned by root or espd's user, mode & 0006 == 0). No
// copy of the key is left behind, and no error names a digit of it.
func readPairKey(path string) (pairsync.Key, error) {
	var k pairsync.Key
	b, err := config.ReadKeyFile("pair key", path, -1)
	if err != nil {
		return k, err
	}
	defer clear(b)
	if len(b) != pairsync.KeyLen {
		return k, fmt.Errorf("pair key %s: %d bytes, want %d (%d hex digits; docs/ha.md, \"The pair link's key\")",
			path, len(b), pairsync.KeyLen, 2*pairsync.KeyLen)
	}
	copy(k[:], b)
	return k, nil
}

// newPair opens the pair link and makes the Node that wraps store (nil:
// in memory). db is read only once Run runs.
func newPair(o PairOptions, store sa.SeqStore, db **sa.DB, log *slog.Logger) (*pair, error) {
	if o.Node != 1 && o.Node != 2 {
		return nil, fmt.Errorf("pair: node %d: a pair's nodes are 1 and 2", o.Node)
	}
	if o.Listen == "" || o.Peer == "" || o.KeyFile == "" {
		return nil, fmt.Errorf("pair: node %d needs the link's own address, the peer's and the key file", o.Node)
	}
	key, err := readPairKey(o.KeyFile)
	if err != nil {
		return nil, err
	}
	c, err := dialPair(o)
	if err != nil {
		clear(key[:])
		return nil, err
	}
	if store == nil {
		store = sa.NewMemSeqStore()
	}
	log = log.With("component", "pair")
	node, err := pairsync.NewNode(pairsync.Config{
		Key: key, Node: o.Node, Conn: c, Peer: c.RemoteAddr(), Store: store, Interval: o.Interval, Lease: o.Lease,
		SeqBlock: sa.DefaultSeqBlock, Locals: o.LocalAddrs, Logger: log,
		Windows:   func() []pairsync.Window { return pairWindows(*db) },
		OnWindows: func(ws []pairsync.Window) { mergeWindows(*db, ws) },
		OnPeerActive: func(rs []pairsync.Reservation) {
			for _, r := range rs {
				if (*db).FollowPeer(r.FP, r.Limit) {
					log.Warn("split brain: a state continues above the other active node's reservation", "above", r.Limit)
				}
			}
		},
	})
	clear(key[:])
	if err != nil {
		c.Close()
		return nil, err
	}
	return &pair{node: node, store: store, num: o.Node, log: log}, nil
}

// linkConn is the pair link's socket, connected to the other node: the
// kernel hands it only the other node's datagrams (nothing from another
// source costs an HMAC), and WriteTo sends to the other node.
type linkConn struct{ *net.UDPConn }

// WriteTo sends b to the other node, whatever a says.
func (c linkConn) WriteTo(b []byte, _ net.Addr) (int, error) { return c.Write(b) }

// dialPair opens the pair link: UDP from Listen, which must be this
// node's address as the other node's --pair-peer names it (the pair's
// parameters include both), connected to Peer, with SO_MARK.
func dialPair(o PairOptions) (linkConn, error) {
	local, err := net.ResolveUDPAddr("udp", o.Listen)
	if err != nil {
		return linkConn{}, fmt.Errorf("pair listen: %w", err)
	}
	if local.IP == nil || local.IP.IsUnspecified() || local.Port == 0 {
		return linkConn{}, fmt.Errorf("pair listen %q: give this node's own address and port on the pair link (the other node's --pair-peer)", o.Listen)
	}
	peer, err := net.ResolveUDPAddr("udp", o.Peer)
	if err != nil {
		return linkConn{}, fmt.Errorf("pair peer: %w", err)
	}
	d := net.Dialer{LocalAddr: local, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, int(o.Mark))
		}); err != nil {
			return err
		}
		return serr
	}}
	c, err := d.DialContext(context.Background(), "udp", peer.String())
	if err != nil {
		return linkConn{}, fmt.Errorf("pair link: %w", err)
	}
	return linkConn{c.(*net.UDPConn)}, nil
}

// pairWindows returns the replay windows of the live inbound states.
func pairWindows(db *sa.DB) []pairsync.Window {
	var ws []pairsync.Window
	for _, s := range db.SAs() {
		if s.Dir() != sa.DirIn || !s.Alive() {
			continue
		}
		// A state that received nothing is reported too (top 0), so
		// that the standby holds its window fresh.
		w := pairsync.Window{FP: s.Fingerprint(), Top: s.ReplayTop()}
		if w.Top != 0 {
			w.Bitmap = s.ReplayBitmap()
		}
		ws = append(ws, w)
	}
	return ws
}

// mergeWindows adds reported windows to the inbound states of their keys.
func mergeWindows(db *sa.DB, ws []pairsync.Window) {
	if len(ws) == 0 {
		return
	}
	byFP := make(map[crypto.Fingerprint]pairsync.Window, len(ws))
	for _, w := range ws {
		byFP[w.FP] = w
	}
	for _, s := range db.SAs() {
		if s.Dir() != sa.DirIn {
			continue
		}
		if w, ok := byFP[s.Fingerprint()]; ok {
			s.MergeReplay(w.Top, w.Bitmap)
		}
	}
}

// pairRole sets (role != 0) or reads this node's role (PAIR_ROLE).
// Becoming active merges the windows the other node reported into the
// inbound states and releases each silent outbound state above its
// key's fresh report (sa.DB.Activate); a key without one stays silent
// and is soft-expired, so charon rekeys it. Becoming standby silences
// every outbound state. A read answers during a takeover.
func (d *Daemon) pairRole(role wire.PairRole) (wire.PairStatus, error) {
	p := d.pair
	if p == nil {
		return wire.PairStatus{}, wire.Errorf(wire.EOPNOTSUPP, "espd runs without --pair-node: it is not one of a gateway pair")
	}
	switch role {
	case wire.PairRoleNone:
	case wire.PairRoleActive:
		p.roleMu.Lock()
		if p.node.Role() != pairsync.RoleActive || d.db.Standby() {
			p.node.SetRole(pairsync.RoleActive)
			d.activate(p)
		}
		p.roleMu.Unlock()
	case wire.PairRoleStandby:
		p.roleMu.Lock()
		d.db.SetStandby(true)
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
func (d *Daemon) activate(p *pair) {
	stale := 0
	for _, s := range d.db.SAs() {
		if s.Dir() != sa.DirIn || !s.Alive() {
			continue
		}
		w, fresh := p.node.FreshWindow(s.Fingerprint())
		if w.Top != 0 || len(w.Bitmap) != 0 {
			s.MergeReplay(w.Top, w.Bitmap)
		}
		if !fresh {
			stale++
			if d.db.RekeyInbound(s) {
				p.log.Warn("takeover: no fresh replay window report for an inbound state: it is rekeyed", "spi", fmt.Sprintf("0x%08x", s.SPI()))
			}
		}
	}
	p.setCounts(0, 0, stale)
	d.release(p, p.node.Report, "takeover", false)
	released, silent, _ := p.counts()
	p.log.Info("pair role active", "released", released, "silent", silent, "stale_windows", stale)
}

// release runs sa.DB.Activate with report on the silent outbound states,
// counting what it released and what stays silent; how names the
// release in the log, and a quiet one logs only releases. Called with
// p.roleMu held.
func (d *Daemon) release(p *pair, report func(crypto.Fingerprint) (uint64, bool), how string, quiet bool) {
	silent, released := 0, 0
	for _, a := range d.db.Activate(report) {
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

// retryRelease, while the node is active, releases every Interval the
// outbound states still silent (their keys had no fresh report at the
// takeover, or they were added silent since) once a fresh report of
// their key arrives: the other node's own reservations, at a first start
// where neither was active before, or after espd restarted.
func (d *Daemon) retryRelease(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p := d.pair
		p.roleMu.Lock()
		if _, silent, _ := p.counts(); p.node.Role() == pairsync.RoleActive && silent > 0 {
			d.release(p, p.node.Report, "takeover", true)
		}
		p.roleMu.Unlock()
	}
}

// applyRoleFile gives the node the role recorded in Options.Pair.RoleFile
// (the notify script writes it before it calls espctl pair role), so that
// an espd restarted on the active node takes its part again; without the
// file it stands by. Restarted active, a state still silent after the
// lease (no fresh report: the other node is down) continues above this
// node's own durable record, which holds every report the other node
// made while this one was active; the other node could only have sent
// more in its own blocks by becoming active meanwhile, which VRRP
// prevents while this node's keepalived stayed master.
func (d *Daemon) applyRoleFile(ctx context.Context) {
	path := d.opts.Pair.RoleFile
	if d.pair == nil || path == "" {
		return
	}
	b, err := readRoleFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		d.pair.log.Warn("pair role file: standing by", "path", path, "err", err)
		return
	}
	switch r := strings.TrimSpace(string(b)); r {
	case "active":
		d.pair.log.Info("pair role file says active", "path", path)
		d.pairRole(wire.PairRoleActive)
		go d.releaseOwn(ctx, cmp.Or(d.opts.Pair.Lease, pairsync.DefaultLease)*11/10)
	case "standby":
	default:
		d.pair.log.Warn("pair role file: want active or standby: standing by", "path", path, "content", r)
	}
}

// releaseOwn waits wait, then releases the states still silent above
// their own record (applyRoleFile).
func (d *Daemon) releaseOwn(ctx context.Context, wait time.Duration) {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C:
	}
	p := d.pair
	p.roleMu.Lock()
	defer p.roleMu.Unlock()
	if _, silent, _ := p.counts(); p.node.Role() != pairsync.RoleActive || silent == 0 {
		return
	}
	if p.node.Conflict() {
		p.log.Error("restarted active: the other node is alive but misconfigured (espd_pair_misconfigured_total): the states stay silent")
		return
	}
	d.release(p, func(crypto.Fingerprint) (uint64, bool) { return 0, true },
		"restarted active without a fresh report from the other node, above this node's own record", false)
}
