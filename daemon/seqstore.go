package daemon

import (
	"errors"
	"log/slog"

	"github.com/espd/espd/sa"
	"github.com/espd/espd/seqstore"
)

// openSeqStore opens the durable record of outbound sequence numbers in
// dir (Options.StateDir) for the SA database, and returns it with the
// function that closes it. An empty dir keeps it in memory (sa's default:
// safe for the life of the process only).
//
// A damaged store (seqstore.ErrCorrupt: a bad record, a log that does
// not match its witness) does not stop espd: it starts with a store that
// refuses every outbound state with the reason, and says so loudly,
// because it cannot know which sequence numbers its keys have sent.
// Inbound states (their keys unrecorded) and policies work as usual, and
// the operator can see and fix the cause (docs/safety.md). Any other
// failure (the directory is in use by another espd, has unsafe
// permissions, cannot be created) is returned: espd refuses to start.
func openSeqStore(dir string, log *slog.Logger) (sa.SeqStore, func() error, error) {
	none := func() error { return nil }
	log = log.With("component", "seqstore")
	if dir == "" {
		log.Warn("no state directory: outbound sequence numbers are kept in memory only, so a key added again after a restart can repeat nonces")
		return nil, none, nil
	}
	st, err := seqstore.Open(dir, seqstore.Options{Logger: log})
	if errors.Is(err, seqstore.ErrCorrupt) {
		log.Error("REFUSING EVERY OUTBOUND SA: the record of sequence numbers sent is damaged (docs/safety.md)", "fix", "move seq.log and seq.head aside, install fresh keys", "inbound", "works", "err", err)
		return seqstore.Refuse{Err: err}, none, nil
	}
	if err != nil {
		return nil, none, err
	}
	log.Info("sequence-number store open", "path", st.Path())
	return st, st.Close, nil
}

// seqErrorLogger returns sa.Options.SeqError: failures the SA database
// can only retry or put up with, logged.
func seqErrorLogger(log *slog.Logger) func(error) {
	log = log.With("component", "seqstore")
	return func(err error) { log.Error("sequence-number store", "err", err) }
}
