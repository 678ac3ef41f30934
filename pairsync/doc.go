// Package pairsync holds the messages the two espds of an active/standby
// pair exchange so that a takeover continues the pair's ESP states
// exactly, and the standby's record of what they say.
//
// The active tells the standby, before it uses them, how far each
// outbound key's sequence numbers are reserved (Reserve, answered by an
// Ack that names the request), and reports where each inbound key's
// replay window stands (Windows). Every record is absolute and the Ledger
// merges it upward only (the higher reservation, the union of what the
// windows refused), so a message that is replayed, duplicated or
// reordered cannot move anything back; an Ack echoes its request's epoch
// and counter, so an old Ack cannot confirm a new reservation. Messages
// are authenticated with HMAC-SHA256 under the pair's key.
//
// The design (why UDP and this, and not the kernel's XFRM events or a
// stream) and what a takeover promises are in docs/ha.md once the pair
// is built; this package is its first piece.
package pairsync
