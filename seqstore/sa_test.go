package seqstore

import "github.com/espd/espd/sa"

// Both are what the SA database takes as its Options.Seq.
var (
	_ sa.SeqStore = (*Store)(nil)
	_ sa.SeqStore = Refuse{}
)
