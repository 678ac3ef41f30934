package wire

import (
	"fmt"
	"reflect"
	"strings"
)

// Errno is the numeric code of an ERROR reply: a Linux errno value, so that a
// C client can hand it to strerror.
type Errno uint32

// Error codes the server sends (docs/control-protocol.md, "Errors").
const (
	ENOENT          Errno = 2   // no such SA or policy
	EIO             Errno = 5   // the daemon failed internally
	EAGAIN          Errno = 11  // too many connections; try again later
	EACCES          Errno = 13  // the peer's credentials are not authorized
	EEXIST          Errno = 17  // the SA, policy or SPI already exists
	EINVAL          Errno = 22  // a value is invalid or a required attribute missing
	ENOSPC          Errno = 28  // no free SPI in the range; table full
	EPROTO          Errno = 71  // message not valid here (a reply flag on a request, ...)
	EBADMSG         Errno = 74  // the message cannot be parsed
	EMSGSIZE        Errno = 90  // the message is larger than the maximum
	EPROTONOSUPPORT Errno = 93  // protocol version (or IPsec protocol) not supported
	EOPNOTSUPP      Errno = 95  // message type or feature not implemented
	ETIMEDOUT       Errno = 110 // a message was not completed in time
	EALREADY        Errno = 114 // already subscribed
)

// String returns the symbolic name of the code.
func (e Errno) String() string {
	switch e {
	case ENOENT:
		return "ENOENT"
	case EIO:
		return "EIO"
	case EAGAIN:
		return "EAGAIN"
	case EACCES:
		return "EACCES"
	case EEXIST:
		return "EEXIST"
	case EINVAL:
		return "EINVAL"
	case ENOSPC:
		return "ENOSPC"
	case EPROTO:
		return "EPROTO"
	case EBADMSG:
		return "EBADMSG"
	case EMSGSIZE:
		return "EMSGSIZE"
	case EPROTONOSUPPORT:
		return "EPROTONOSUPPORT"
	case EOPNOTSUPP:
		return "EOPNOTSUPP"
	case ETIMEDOUT:
		return "ETIMEDOUT"
	case EALREADY:
		return "EALREADY"
	}
	return fmt.Sprintf("errno %d", uint32(e))
}

// Error is an ERROR reply: a code and a human-readable message. Clients
// return it from a failed request; backends may return one to choose the
// code the server sends.
type Error struct {
	Code Errno
	Msg  string
	// Type is the message type of the request that failed (0 if unknown).
	Type MsgType
	// Attr is the attribute at fault, 0 if none.
	Attr AttrType
	// Versions lists the protocol versions the server speaks, set with
	// EPROTONOSUPPORT.
	Versions []uint8
}

// Error formats the code and the message.
func (e *Error) Error() string {
	if e.Msg == "" {
		return e.Code.String()
	}
	return e.Msg + " (" + e.Code.String() + ")"
}

// Is lets errors.Is match an *Error against the syscall.Errno of the same
// number (errors.Is(err, syscall.ENOENT)) or against another *Error with the
// same code. This package does no I/O and does not import syscall: it
// knows a syscall.Errno by its type, a uintptr named Errno in package
// syscall.
func (e *Error) Is(target error) bool {
	if t, ok := target.(*Error); ok {
		return t.Code == e.Code
	}
	v := reflect.ValueOf(target)
	return v.Kind() == reflect.Uintptr && v.Type().PkgPath() == "syscall" && v.Type().Name() == "Errno" &&
		v.Uint() == uint64(e.Code)
}

// Errorf returns an *Error with the code and a formatted message.
func Errorf(code Errno, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// PutError appends the attributes of an ERROR message.
func PutError(b *Builder, e *Error) {
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

// ReadError reads an ERROR message into an *Error.
func ReadError(attrs []Attr) (*Error, error) {
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
