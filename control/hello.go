package control

import (
	"fmt"
	"slices"
	"strings"
)

// HelloInfo is the HELLO reply: the version chosen and the server's limits.
type HelloInfo struct {
	Version        uint8
	Software       string
	MaxMessageSize int
}

// Software is what the server reports in its HELLO reply.
const Software = "espd"

// readHelloVersions reads the VERSION attributes of a HELLO request; none
// means the version in the header.
func readHelloVersions(m *Message) ([]uint8, error) {
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

// chooseVersion returns the highest version both sides speak.
func chooseVersion(offered []uint8) (uint8, bool) {
	var best uint8
	found := false
	for _, v := range offered {
		if slices.Contains(SupportedVersions, v) && (!found || v > best) {
			best, found = v, true
		}
	}
	return best, found
}

// versionError is the EPROTONOSUPPORT error naming the versions supported.
func versionError(offered []uint8) *Error {
	return &Error{
		Code:     EPROTONOSUPPORT,
		Msg:      fmt.Sprintf("protocol version %s not supported; this server speaks %s", versionList(offered), versionList(SupportedVersions)),
		Versions: SupportedVersions,
	}
}

func versionList(vs []uint8) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprint(v)
	}
	return strings.Join(s, ", ")
}

func putHelloReply(b *Builder, h HelloInfo) {
	b.U32(AttrVersion, uint32(h.Version))
	b.String(AttrSoftware, h.Software)
	b.U32(AttrMaxMsgSize, uint32(h.MaxMessageSize))
}

func readHelloReply(attrs []Attr) (HelloInfo, error) {
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

// putError appends the attributes of an ERROR message.
func putError(b *Builder, e *Error) {
	b.U32(AttrErrCode, uint32(e.Code))
	msg := e.Msg
	if len(msg) > 1024 {
		msg = msg[:1024]
	}
	b.String(AttrErrMsg, strings.ToValidUTF8(msg, "?"))
	if e.Type != 0 {
		b.U32(AttrErrType, uint32(e.Type))
	}
	if e.Attr != 0 {
		b.U32(AttrErrAttr, uint32(e.Attr))
	}
	for _, v := range e.Versions {
		b.U32(AttrVersion, uint32(v))
	}
}

// readError reads an ERROR message into an *Error.
func readError(attrs []Attr) (*Error, error) {
	r := newReader(attrs)
	e := &Error{}
	code, ok := r.u32(AttrErrCode)
	r.require(AttrErrCode, ok)
	e.Code = Errno(code)
	e.Msg, _ = r.str(AttrErrMsg)
	t, _ := r.u32max(AttrErrType, 0xFFFF)
	e.Type = MsgType(t)
	a, _ := r.u32max(AttrErrAttr, 0xFFFF)
	e.Attr = AttrType(a)
	for _, at := range r.all(AttrVersion) {
		n := &reader{attrs: []Attr{at}, space: spaceTop}
		v, _ := n.u32max(AttrVersion, 255)
		r.absorb(n)
		e.Versions = append(e.Versions, uint8(v))
	}
	if err := r.error(); err != nil {
		return nil, err
	}
	return e, nil
}
