// Package seqstore keeps, on disk, how far the sequence numbers of every
// outbound key may have gone, so that espd never sends a (key, sequence
// number) pair twice: not after a restart, not after a crash. A repeated
// pair repeats an AES-GCM or ChaCha20-Poly1305 nonce, which gives the key
// away. *Store implements sa.SeqStore: the SA database resumes a key above
// Resume, reserves blocks of sequence numbers ahead with Reserve (durable
// before any of them is sent) and records the exact last number with
// Retire when the state goes.
//
// Keys are known only by their fingerprint (crypto.KeyFingerprint, a
// one-way SHA-256 digest): the store never sees a key, and its file holds
// fingerprints, sequence numbers and a clock, nothing else.
//
// # On disk
//
// A state directory (espd --state-dir, default /var/lib/espd), mode 0700,
// that one espd at a time holds with an flock on the directory itself
// (and on its "lock" file, which holds the pid); an append-only log,
// "seq.log": fixed-size records, each with its own CRC-32C, written and
// fsynced before the call returns; and its witness, "seq.head" (head.go),
// which acknowledges, fsynced after each record, how many records the
// log holds and a hash chain over them. Open refuses, with a
// *CorruptError (errors.Is ErrCorrupt), a log shorter than its witness
// says, an acknowledged record damaged or changed, a log missing or empty
// while the witness exists, or a witness missing or unreadable while the
// log exists: espd cannot know which numbers were used, so it must not
// send with any key it might have used before. Only a record beyond what
// the witness acknowledges may be torn by a crash (it was written, its
// call never returned): Open reads it if it is whole and valid and
// ignores it if it is the last. A version 1 log (older espd, no witness)
// is accepted as it is, once, and upgraded. The log is compacted (the
// newest record of each key written to a new file, fsynced, acknowledged
// by the witness with the old log, renamed over the old one, the
// directory fsynced, then acknowledged alone) at Open and whenever it has
// grown by half, without stopping writers for more than the copy of what
// is in memory.
//
// The store also records inbound keys (Inbound, RetireInbound): a key
// serves one direction for ever, and Resume refuses a key that served
// inbound, Inbound a key that served outbound, with ErrDirection.
//
// # Retention
//
// A key in use (resumed or reserved and not retired) is never dropped.
// Resume says where a key comes from (sa.Config.Negotiated). A manual
// key (espctl, the configuration file, a control client that does not say
// otherwise) may be added again at any time, after any pause, so the
// record of a manual key is kept for ever, retired or not: dropping it
// would let the key start again at sequence number 1. Only a key whose
// every state was negotiated by an IKE daemon, which never installs a key
// again once its CHILD_SA is gone, is recorded as negotiated; its record,
// once retired, is kept for Options.Retain of espd's running time
// (DefaultRetain by default), which covers a restart of espd under the
// IKE daemon (the plugin installs the same keys again within seconds) and
// bounds the disk and memory that retired IKE keys take. A key is
// negotiated only while every Resume of it says so: one manual Resume
// makes its record manual, durably and for good. Records written before
// the origin was recorded have no negotiated flag and are kept for ever.
package seqstore
