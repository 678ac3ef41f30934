// Package sa holds espd's security association database (SADB) and security
// policy database (SPD), in Linux XFRM vocabulary: an SA is a state, keyed
// by SPI and outer destination; a policy has a selector, a direction, an
// action and a reqid that ties it to the states that protect its traffic.
//
// The data path reads the databases without locks: LookupInbound,
// OutboundSA, GetSA and LookupPolicy are safe to call from many goroutines
// while the control plane adds and deletes. Per-SA counters are atomics the
// data path updates once per batch (Account, Drop); byte and packet
// lifetimes are checked there, time lifetimes by Run. The data path holds
// each state it uses for the span of a batch's crypto (Hold, Release): a
// state keeps no copy of its keys, only its crypto.Transform, which is
// zeroed when the state is deleted or hard-expired and the last hold is
// released. Expiries and acquires reach the control plane through
// Subscribe.
//
// No (key, sequence number) pair is sent twice (seqkeys.go). The DB knows
// keys only by their fingerprint (crypto.KeyFingerprint) and refuses a key
// that another live state has, in either direction. An outbound state
// continues above whatever its key may already have sent, as a SeqStore
// (Options.Seq) records it, durably before use, in blocks reserved ahead;
// Apply replaces states and policies all at once, and a state replaced
// under the same key continues the old one's sequence numbers (outbound)
// or replay window (inbound). Config.OSeq only ever raises where an
// outbound state starts (a floor above all of that), and Config.ReplaySeq
// and ReplayBitmap are merged into an inbound state's window (a union):
// neither can make espd repeat a number or accept one it would refuse.
package sa
