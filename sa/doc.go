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
// deleted or hard-expired state's key copies are zeroed at once, its
// crypto.Transform when the last hold is released. Expiries and acquires
// reach the control plane through Subscribe.
package sa
