package control

// Test-only API: what the tests use and espd does not.

// Encode encodes m. It fails when the message would exceed MaxMessageSize or
// an attribute value does not fit in an attribute.
func (m *Message) Encode() ([]byte, error) {
	b := NewBuilder(m.Version, m.Type, m.Flags, m.Seq)
	for _, a := range m.Attrs {
		b.Raw(a.Type, a.Value)
	}
	return b.Bytes()
}

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
