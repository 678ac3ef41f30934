package pairsync

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
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
	Key   Key
	Conn  net.PacketConn // bound to the pair link; the Node owns it
	Peer  net.Addr       // the other node's Conn
	Store Store          // this node's durable store
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

	mu           sync.Mutex
	role         Role
	counter      uint64
	standbySince uint64                        // stamp at which this node last became standby
	reserved     map[crypto.Fingerprint]uint64 // this node's reservations, carried while active
	acked        map[crypto.Fingerprint]uint64 // what the standby acknowledged of them
	fresh        map[crypto.Fingerprint]uint64 // standby: the latest echo that carried the key
	lastHeard    time.Duration                 // the standby's latest Hello or Ack (0: start)
	peerEpoch    uint64                        // the other node's run, and its latest stamp
	peerStamp    uint64
	heardAt      time.Duration // when anything authentic last came (0: never)
	recordErr    bool          // the ledger failed to record: no hello until it works again
	changed      chan struct{} // closed and replaced when acked or lastHeard moves
	closed       bool
	stats        Stats
	splitWarned  time.Duration
}

// Stats counts a Node's traffic and waits.
type Stats struct {
	Sent, Received       [6]uint64 // messages by Type (index 0: others)
	SentBytes, RecvBytes uint64
	SendErrors           uint64
	Rejected             uint64 // not authentic or malformed
	SplitBrain           uint64 // active messages received while active
	LeaseWaits           uint64 // reservations that proceeded on the lease, unacknowledged
	AckWaits             uint64 // reservations that waited for an Ack and got it
	RecordErrors         uint64 // reports the ledger failed to record
}

// NewNode returns a Node in RoleStandby; Run serves it.
func NewNode(cfg Config) (*Node, error) {
	if cfg.Conn == nil || cfg.Peer == nil || cfg.Store == nil {
		return nil, errors.New("pairsync: a node needs a connection, the peer's address and a store")
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
	var e [8]byte
	rand.Read(e[:])
	n := &Node{
		cfg: cfg, log: log, start: time.Now(), epoch: binary.BigEndian.Uint64(e[:]) | 1,
		role: RoleStandby, reserved: map[crypto.Fingerprint]uint64{}, acked: map[crypto.Fingerprint]uint64{},
		fresh: map[crypto.Fingerprint]uint64{}, changed: make(chan struct{}),
	}
	n.ledger = NewLedger(cfg.Store)
	return n, nil
}

// now is the node's monotonic clock: the time since it started.
func (n *Node) now() time.Duration { return time.Since(n.start) }

// Epoch returns the random name of this node's run.
func (n *Node) Epoch() uint64 { return n.epoch }

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
