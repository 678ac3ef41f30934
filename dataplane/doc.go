// Package dataplane is espd's data path: it reads cleartext packets from
// the TUN device, encrypts them as ESP and sends them to the peers, and
// receives ESP from the outer sockets, decrypts it and writes the inner
// packets to the TUN.
//
// A Device runs on the TUN, conn.Bind and callbacks its caller gives it
// (IO); it creates no device, socket or route. Its stages move batches:
// readers look up each packet's policy and state, the crypto runs on the
// reader or on Config.Workers workers, and each state's packets leave in
// the order they arrived, whatever the number of workers (per-shard
// in-order stages). Memory is bounded by Config.QueueLen and Config.Batch,
// not by the number of states, and the steady state allocates nothing per
// packet. docs/dataplane.md has the design and its rationale.
package dataplane
