package dataplane

import (
	"fmt"
	"time"
)

// BufferSize is the size of every packet buffer. It holds the largest
// TUN packet (MTU up to BufferSize-esp.MaxHeadroom-esp.MaxTrailer) with
// its ESP framing, and an outer packet of a jumbo-frame path. Writes to
// the TUN coalesce segments without room here: the writev points at each
// packet in its own buffer (package tun).
const BufferSize = 16 << 10

// Defaults for Config.
const (
	DefaultKeepalive = 20 * time.Second
	DefaultOuterMTU  = 1500
	DefaultQueueLen  = 16
	DefaultBatch     = 128
	// DefaultHandOffBelow is cmd/espd's Config.HandOffBelow: AES-GCM with
	// AES-NI and ChaCha20-Poly1305 with AVX2 or SSSE3 run faster on a
	// current x86 core and stay on the readers; the same suites in
	// portable Go, and CPUs as slow as the Atom gateways espd is for, go
	// to the workers.
	DefaultHandOffBelow = 1000
	DefaultICMPRate     = 100
)

// Config configures a Device. The zero value is usable: every field has a
// default.
type Config struct {
	// Workers is the number of crypto goroutines. 0 means none: each
	// reader encrypts or decrypts its own batches and sends or writes them
	// itself (run to completion). n > 0 hands the batches to n workers and
	// n in-order stages per direction (docs/dataplane.md).
	Workers int
	// HandOffBelow, with workers, is a crypto rate in MB/s: while the
	// crypto of a direction's batches runs slower than this (as measured
	// on them), its readers hand the batches off to the workers; while it
	// runs faster, they run them to completion as with no workers. 0
	// means always hand off. cmd/espd's default is DefaultHandOffBelow.
	HandOffBelow int
	// OnHandOff, if set with HandOffBelow, is called with true when a
	// direction starts handing its batches off to the workers, and with
	// false when neither does any more: from a goroutine of its own, never
	// the data path, never concurrently, at most every 500 ms (a change
	// back within that time is reported late or not at all). cmd/espd
	// uses it to set GOMAXPROCS.
	OnHandOff func(handOff bool)
	// OuterMTU is the MTU of the path to the peers. 0 means the MTU of
	// the route to each peer (IO.PathMTU, refreshed every 30 s), or
	// DefaultOuterMTU without IO.PathMTU.
	OuterMTU int
	// QueueLen is how many batches may wait for crypto and sending in
	// each direction, shared by its in-order shards (one per worker):
	// each shard's queue holds QueueLen/shards, rounded up, and at least
	// 2. 0 means DefaultQueueLen.
	QueueLen int
	// Batch is the number of packets per batch (the outer sockets take
	// theirs from the caller); 0 means DefaultBatch.
	Batch int
	// Keepalive is the NAT-keepalive interval for outbound states with
	// UDP encapsulation; 0 means DefaultKeepalive, negative disables.
	Keepalive time.Duration
	// ICMPRate bounds the "fragmentation needed" and "packet too big"
	// errors written to the TUN, per second; 0 means DefaultICMPRate,
	// negative disables them.
	ICMPRate int
}

func (c *Config) setDefaults() error {
	if c.Workers < 0 {
		c.Workers = 0
	}
	if c.QueueLen <= 0 {
		c.QueueLen = DefaultQueueLen
	}
	if c.Batch <= 0 {
		c.Batch = DefaultBatch
	}
	if c.OuterMTU < 0 || c.OuterMTU > 65535 || (c.OuterMTU > 0 && c.OuterMTU < 576) {
		return fmt.Errorf("dataplane: outer MTU %d out of range 576..65535", c.OuterMTU)
	}
	if c.Keepalive == 0 {
		c.Keepalive = DefaultKeepalive
	}
	if c.ICMPRate == 0 {
		c.ICMPRate = DefaultICMPRate
	}
	return nil
}
