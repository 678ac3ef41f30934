package wire

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
