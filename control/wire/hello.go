package wire

// HelloInfo is the HELLO reply: the version chosen and the server's limits.
type HelloInfo struct {
	Version        uint8
	Software       string
	MaxMessageSize int
}

// PutHello appends the attributes of a HELLO request: a VERSION per
// version offered.
func PutHello(b *Builder, versions []uint8) {
	for _, v := range versions {
		b.U32(AttrVersion, uint32(v))
	}
}

// ReadHello reads the versions a HELLO request offers: its VERSION
// attributes, or, with none, the version in its header.
func ReadHello(m *Message) ([]uint8, error) {
	r := newReader(m.Attrs)
	var vs []uint8
	for _, a := range r.all(AttrVersion) {
		n := &reader{attrs: []Attr{a}, space: spaceTop}
		v, _ := n.u32max(AttrVersion, 255)
		r.absorb(n)
		vs = append(vs, uint8(v))
	}
	if r.err != nil {
		return nil, r.error()
	}
	if len(vs) == 0 {
		vs = []uint8{m.Version}
	}
	return vs, nil
}

// PutHelloReply appends the attributes of a HELLO reply.
func PutHelloReply(b *Builder, h HelloInfo) {
	b.U32(AttrVersion, uint32(h.Version))
	b.String(AttrSoftware, h.Software)
	b.U32(AttrMaxMsgSize, uint32(h.MaxMessageSize))
}

// ReadHelloReply reads a HELLO reply.
func ReadHelloReply(attrs []Attr) (HelloInfo, error) {
	r := newReader(attrs)
	var h HelloInfo
	v, ok := r.u32max(AttrVersion, 255)
	r.require(AttrVersion, ok)
	h.Version = uint8(v)
	h.Software, _ = r.str(AttrSoftware)
	ms, _ := r.u32(AttrMaxMsgSize)
	h.MaxMessageSize = int(ms)
	return h, r.error()
}
