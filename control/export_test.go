package control

// Test-only API: what the tests use and espd does not.

// ServerStats counts what the server did.
type ServerStats struct {
	// Active is the number of connections being served.
	Active int
	// Accepted counts connections served; Refused those turned away
	// (credentials); Evicted those closed to make room at MaxConns.
	Accepted, Refused, Evicted uint64
}

// Stats returns the server's counters.
func (s *Server) Stats() ServerStats {
	return ServerStats{Active: int(s.active.Load()), Accepted: s.accepted.Load(), Refused: s.refused.Load(), Evicted: s.evicted.Load()}
}
