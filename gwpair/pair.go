// Package gwpair is espd's part in an active/standby gateway pair
// (docs/ha.md): the pair link to the other node (a pairsync.Node over a
// connected, marked UDP socket, keyed from the pair's key file), the
// replay windows it reports and merges, and the node's role: a takeover
// (PAIR_ROLE active) releases the silent outbound states above the other
// node's fresh reports, standing by silences them, and the role file
// gives the role back to a restarted espd.
package gwpair

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/espd/espd/config"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/pairsync"
	"github.com/espd/espd/sa"
)

// Options make espd one node of an active/standby gateway pair
// (docs/ha.md). Node 0: no pair.
type Options struct {
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
	// node takes when espd starts (ApplyRoleFile).
	RoleFile string
}

// Pair is one node's part in a gateway pair.
type Pair struct {
	node  *pairsync.Node
	store sa.SeqStore // the node's own store, which node wraps
	num   int
	log   *slog.Logger
	db    *sa.DB // SetDB's

	// roleMu serializes role changes and releases; it is held through a
	// takeover (sa.DB.Activate), so that status requests and metrics,
	// which take mu only, answer meanwhile.
	roleMu sync.Mutex
	mu     sync.Mutex // guards the counts of the last takeover
	// released and silent count outbound states, stale inbound ones
	// whose replay window no fresh report gave (activate).
	released, silent, stale int
}

// Node returns the pair link's node: the sequence-number store the SA
// database draws from (sa.Options.Seq), to be run (pairsync.Node.Run)
// while espd runs.
func (p *Pair) Node() *pairsync.Node { return p.node }

// Store returns this node's own sequence-number store, which Node wraps
// (sa.Options.LocalSeq).
func (p *Pair) Store() sa.SeqStore { return p.store }

// Num returns this node's number, 1 or 2.
func (p *Pair) Num() int { return p.num }

// SetDB gives the pair the SA database, made over Node; it must be called
// before Node runs or the role is set.
func (p *Pair) SetDB(db *sa.DB) { p.db = db }

// counts returns the last takeover's counts.
func (p *Pair) counts() (released, silent, stale int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.released, p.silent, p.stale
}

// setCounts sets them.
func (p *Pair) setCounts(released, silent, stale int) {
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

// New opens the pair link and makes the Node that wraps store (nil: in
// memory); log (nil: none) hears of the pair. SetDB gives it the
// database before it runs.
func New(o Options, store sa.SeqStore, log *slog.Logger) (*Pair, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
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
	p := &Pair{store: store, num: o.Node, log: log}
	node, err := pairsync.NewNode(pairsync.Config{
		Key: key, Node: o.Node, Conn: c, Peer: c.RemoteAddr(), Store: store, Interval: o.Interval, Lease: o.Lease,
		SeqBlock: sa.DefaultSeqBlock, Locals: o.LocalAddrs, Logger: log,
		Windows:   func() []pairsync.Window { return pairWindows(p.db) },
		OnWindows: func(ws []pairsync.Window) { mergeWindows(p.db, ws) },
		OnPeerActive: func(rs []pairsync.Reservation) {
			for _, r := range rs {
				if p.db.FollowPeer(r.FP, r.Limit) {
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
	p.node = node
	return p, nil
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
func dialPair(o Options) (linkConn, error) {
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
