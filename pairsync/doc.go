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
// The rules a takeover relies on (Node applies them; docs/ha.md gives the
// rationale):
//
//   - Disjoint numbers: the nodes hand out numbers of their own blocks
//     only (sa.Options.PairNode), so that not even a split brain repeats
//     a (key, sequence number).
//   - The lease: every message of the active that carries a key carries
//     its current reservation, and echoes the latest Stamp of the
//     standby. The standby holds a key's reservation as fresh until L
//     after the echoed stamp of the latest message that carried it
//     (stamps taken while it stands by only). The active uses a
//     reservation the standby has not acknowledged only once L·1.1 has
//     passed since it last heard the standby before it made the
//     reservation: every message without it echoes an older stamp, so by
//     then no ledger holds one fresh.
//   - The lease's invariant: every echoed stamp that can make a report
//     fresh is that of a message received no later than lastHeard.
//     Such stamps are those the other node took while it stood by: of
//     its Hello, Ack and Own, the standby's messages. lastHeard moves on
//     each of them the node accepts (authentic, of the other node's
//     number and parameters, newer than what was accepted: replay.go),
//     of whatever type, and the echoed stamp with it; an active's
//     Reserve or Windows moves the echoed stamp only, but a stamp the
//     other node took while active is older than its next standbySince,
//     so no echo of it is ever fresh there (and a node that takes over
//     from a node that was active until it died need not wait for the
//     lease). So no message makes fresh what a Reserve's deadline did
//     not count, however the link drops, delays or reorders messages by
//     type; a delayed message only moves lastHeard later, which makes the
//     active wait longer, never shorter.
//   - An active holds the standby's own reservations (Own) fresh by the
//     same rule, when they echo a stamp of its run: a state left silent
//     at a takeover is released once one arrives (daemon's retryRelease).
//   - A standby's window report is fresh by the same rule (Node.
//     FreshWindow); a takeover uses only fresh ones for its replay bound.
//   - A standby reports its own reservations too (Own, every interval):
//     what it may have sent itself, from its store. Held fresh by the same
//     echo rule, they let a node take over when neither was active before
//     (a first start, manual keys) or after its espd restarted.
//   - A standby takes over a key only with a fresh reservation, above it
//     (sa.DB.Activate); without one the key stays silent until one
//     arrives, and is soft-expired so that its IKE daemon rekeys it.
//   - Two active nodes (a split brain) record each other's reservations
//     and continue above them (sa.DB.FollowPeer).
//   - Bounded state: a key the other node stopped reporting is forgotten
//     after three leases, in memory and in the store (forget.go).
package pairsync
