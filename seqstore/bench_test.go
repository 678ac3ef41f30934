package seqstore

import "testing"

// BenchmarkReserve is the cost of one durable reservation (a block of
// sequence numbers): the record's write and fsync, and the witness's.
func BenchmarkReserve(b *testing.B) {
	s, err := Open(b.TempDir(), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	k := fp(1)
	if _, err := s.Resume(k, false); err != nil {
		b.Fatal(err)
	}
	for i := 1; b.Loop(); i++ {
		if err := s.Reserve(k, uint64(i)<<20); err != nil {
			b.Fatal(err)
		}
	}
}
