package pairsync

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/espd/espd/crypto"
)

// Role is a node's part in the pair.
type Role uint8

// Roles; a Node starts as RoleStandby.
const (
	RoleActive  Role = 1 // sends on its states; reports to the other node
	RoleStandby Role = 2 // sends nothing; records and acknowledges
)

func (r Role) String() string {
	switch r {
	case RoleActive:
		return "active"
	case RoleStandby:
		return "standby"
	}
	return fmt.Sprintf("role %d", uint8(r))
}

// Store is the node's own durable sequence-number store, with the methods
// of sa.SeqStore; a Node is itself one, wrapping it.
type Store interface {
	Resume(fp crypto.Fingerprint, negotiated bool) (uint64, error)
	Reserve(fp crypto.Fingerprint, limit uint64) error
	Retire(fp crypto.Fingerprint, last uint64) error
	Inbound(fp crypto.Fingerprint, negotiated bool) error
	RetireInbound(fp crypto.Fingerprint) error
	Used(fp crypto.Fingerprint) (out, in bool, err error)
}

// Defaults of Config.
const (
	DefaultInterval = 500 * time.Millisecond
	DefaultLease    = 5 * time.Second
)

// Config is what a Node needs.
type Config struct {
	Key   Key            // the pair's shared key; the Node derives one per direction
	Node  int            // this node's number: 1 or 2 (sa.Options.PairNode)
	Conn  net.PacketConn // bound to the pair link; the Node owns it
	Peer  net.Addr       // the other node's Conn (a *net.UDPAddr)
	Store Store          // this node's durable store
	// Link is this node's pair-link address as the other node names it
	// (its Peer); the zero value takes Conn's local address.
	Link netip.AddrPort
	// SeqBlock is the sequence block size (sa.Options.SeqBlock), and
	// Locals this node's own addresses (sa.Options.PairLocal): both are
	// checked against the other node's (Params).
	SeqBlock uint64
	Locals   []netip.Addr
	// Interval is how often the active sweeps every reservation and
	// window to the standby (and the standby says hello twice as often);
	// Lease is L of the lease rule (doc.go). Interval must be below Lease.
	Interval, Lease time.Duration
	// Windows returns the inbound states' replay windows, swept while
	// active. OnWindows hears the windows the active reports while this
	// node stands by. Either may be nil.
	Windows   func() []Window
	OnWindows func([]Window)
	// OnPeerActive hears the reservations the other node reports while
	// both are active (a split brain), once recorded in Store: this
	// node's states continue above them (sa.DB.FollowPeer). May be nil.
	OnPeerActive func([]Reservation)
	Logger       *slog.Logger
}

// ErrClosed is returned by a Reserve that the Node's Close interrupted.
var ErrClosed = errors.New("pairsync: node closed")

// Node is one espd's end of the pair's channel (doc.go): it wraps the
// node's sequence-number store and, while active, makes each reservation
// known to the standby before it returns; while standby it records the
// active's reports in its Ledger, acknowledges them and answers Report.
// Methods may be called concurrently.
type Node struct {
	cfg    Config
	log    *slog.Logger
	start  time.Time
	epoch  uint64
	ledger *Ledger
	// sendKey authenticates what this node sends, recvKey what the
	// other node sends (Key.Direction); digest is Params'.
	sendKey, recvKey Key
	digest           Digest
	link, peer       netip.AddrPort

	// sendMu serializes sends: counter numbers messages as they leave.
	sendMu  sync.Mutex
	counter uint64
	sendBuf []byte

	mu           sync.Mutex
	role         Role
	standbySince uint64                        // stamp at which this node last became standby
	reserved     map[crypto.Fingerprint]uint64 // this node's reservations, carried while active
	acked        map[crypto.Fingerprint]uint64 // what the standby acknowledged of them
	fresh        map[crypto.Fingerprint]uint64 // standby: the latest echo that carried the key
	winFresh     map[crypto.Fingerprint]uint64 // standby: the latest echo that carried its window
	seen         map[crypto.Fingerprint]time.Duration
	// lastHeard is when the message whose stamp this node echoes (the
	// other node's latest accepted standby's message) arrived; 0: start
	// (doc.go, replay.go).
	lastHeard   time.Duration
	peerEpoch   uint64 // the other node's run, its latest counter and stamp
	peerCounter uint64
	peerStamp   uint64
	heardAt     time.Duration // when an accepted message last came (0: never)
	changed     chan struct{} // closed and replaced when acked or lastHeard moves
	closed      bool
	stats       Stats
	splitWarned time.Duration
	misWarned   time.Duration
	misHeard    time.Duration // when a misconfigured node's message last came (0: never)
}

// Stats counts a Node's traffic and waits.
type Stats struct {
	Sent, Received       [6]uint64 // messages by Type (index 0: others)
	SentBytes, RecvBytes uint64
	SendErrors           uint64
	Rejected             uint64 // not authentic, malformed, or from another address than Peer
	Reflected            uint64 // this node's own messages, sent back to it
	Replayed             uint64 // authentic, but not newer than what was accepted (replay.go)
	Misconfigured        uint64 // authentic, refused: the other node's number, parameters or addresses
	SplitBrain           uint64 // active messages received while active
	LeaseWaits           uint64 // reservations that proceeded on the lease, unacknowledged
	AckWaits             uint64 // reservations that waited for an Ack and got it
	RecordErrors         uint64 // reservations of the other node the store refused
	Forgotten            uint64 // keys of the other node forgotten, absent from its reports (forget.go)
}

// NewNode returns a Node in RoleStandby; Run serves it.
func NewNode(cfg Config) (*Node, error) {
	if cfg.Conn == nil || cfg.Peer == nil || cfg.Store == nil {
		return nil, errors.New("pairsync: a node needs a connection, the peer's address and a store")
	}
	if cfg.Node != 1 && cfg.Node != 2 {
		return nil, fmt.Errorf("pairsync: node %d: a pair's nodes are 1 and 2", cfg.Node)
	}
	peer, ok := addrPort(cfg.Peer)
	if !ok {
		return nil, fmt.Errorf("pairsync: the peer's address %v is not a UDP address", cfg.Peer)
	}
	if !cfg.Link.IsValid() {
		if cfg.Link, ok = addrPort(cfg.Conn.LocalAddr()); !ok {
			return nil, fmt.Errorf("pairsync: the link's own address %v is not a UDP address", cfg.Conn.LocalAddr())
		}
	}
	if err := checkLocals(cfg.Locals, peer); err != nil {
		return nil, err
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Lease == 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.Interval >= cfg.Lease {
		return nil, fmt.Errorf("pairsync: the sweep interval %v must be shorter than the lease %v", cfg.Interval, cfg.Lease)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	start := time.Now()
	n := &Node{
		cfg: cfg, log: log, start: start, epoch: newEpoch(start), link: cfg.Link, peer: peer,
		sendKey: cfg.Key.Direction(cfg.Node), recvKey: cfg.Key.Direction(3 - cfg.Node),
		role: RoleStandby, reserved: map[crypto.Fingerprint]uint64{}, acked: map[crypto.Fingerprint]uint64{},
		fresh: map[crypto.Fingerprint]uint64{}, winFresh: map[crypto.Fingerprint]uint64{},
		seen: map[crypto.Fingerprint]time.Duration{}, changed: make(chan struct{}),
	}
	clear(n.cfg.Key[:])
	n.cfg.Locals = make([]netip.Addr, len(cfg.Locals))
	for i, a := range cfg.Locals {
		n.cfg.Locals[i] = a.Unmap()
	}
	params := Params{SeqBlock: cfg.SeqBlock, Interval: cfg.Interval, Lease: cfg.Lease}
	params.Links[cfg.Node-1], params.Links[2-cfg.Node] = cfg.Link, peer
	n.digest = params.Digest()
	n.ledger = NewLedger(cfg.Store)
	return n, nil
}

// addrPort returns a's address and port, if a is a UDP address.
func addrPort(a net.Addr) (netip.AddrPort, bool) {
	u, ok := a.(*net.UDPAddr)
	if !ok || u == nil {
		return netip.AddrPort{}, false
	}
	ap := u.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
}

// now is the node's monotonic clock: the time since it started.
func (n *Node) now() time.Duration { return time.Since(n.start) }

// Epoch returns the random name of this node's run.
func (n *Node) Epoch() uint64 { return n.epoch }

// Params returns the digest of the pair's parameters as this node sees
// them (Params.Digest), which its messages carry.
func (n *Node) Params() Digest { return n.digest }

// Ledger returns the node's record of the other node's reports.
func (n *Node) Ledger() *Ledger { return n.ledger }

// Role returns the node's role.
func (n *Node) Role() Role {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.role
}

// SetRole changes the node's role. Becoming standby restarts the count
// of fresh reports (only stamps taken from now on make one fresh);
// either change sends at once what the new role sends.
func (n *Node) SetRole(r Role) {
	n.mu.Lock()
	if r == n.role {
		n.mu.Unlock()
		return
	}
	n.role = r
	if r == RoleStandby {
		n.standbySince = uint64(n.now())
		clear(n.fresh)
	}
	n.mu.Unlock()
	n.log.Info("pair role", "role", r)
	n.tick(true)
}

// Stats returns the node's counters.
func (n *Node) Stats() Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stats
}

// PeerHeard returns how long ago the other node was last heard, and
// false if it never was.
func (n *Node) PeerHeard() (time.Duration, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.heardAt == 0 {
		return 0, false
	}
	return n.now() - n.heardAt, true
}

// Conflict reports whether a message of a misconfigured other node
// (Stats.Misconfigured) arrived within the last two leases: the other
// node is alive but cannot be trusted, so this node must not act on its
// own record alone (gwpair's Pair.ApplyRoleFile). It never gets a fresh
// report from such a node either: a takeover leaves every key silent.
func (n *Node) Conflict() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.misHeard != 0 && n.now()-n.misHeard < 2*n.cfg.Lease
}

// Report returns the active's reservation for fp if this node holds it
// fresh (doc.go), for sa.DB.Activate: above it the key is exact.
func (n *Node) Report(fp crypto.Fingerprint) (uint64, bool) {
	n.mu.Lock()
	echo, ok := n.fresh[fp]
	now := uint64(n.now())
	n.mu.Unlock()
	if !ok || now >= echo+uint64(n.cfg.Lease) {
		return 0, false
	}
	return n.ledger.Reserved(fp)
}

// Window returns the union of the replay windows reported for fp.
func (n *Node) Window(fp crypto.Fingerprint) (Window, bool) { return n.ledger.Window(fp) }

// FreshWindow returns the union of the replay windows reported for fp,
// and whether the latest report of it is fresh by the lease rule (as
// Report's): then the window refuses everything the active accepted up
// to a moment less than the lease ago.
func (n *Node) FreshWindow(fp crypto.Fingerprint) (Window, bool) {
	n.mu.Lock()
	echo, ok := n.winFresh[fp]
	now := uint64(n.now())
	n.mu.Unlock()
	w, known := n.ledger.Window(fp)
	return w, known && ok && now < echo+uint64(n.cfg.Lease)
}

// Close stops Run (closing the connection) and interrupts waiting
// Reserves.
func (n *Node) Close() error {
	n.mu.Lock()
	if !n.closed {
		n.closed = true
		n.broadcastLocked()
	}
	n.mu.Unlock()
	return n.cfg.Conn.Close()
}

// broadcastLocked wakes the Reserves that wait.
func (n *Node) broadcastLocked() {
	close(n.changed)
	n.changed = make(chan struct{})
}
