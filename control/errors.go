package control

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/espd/espd/sa"
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
// same code.
func (e *Error) Is(target error) bool {
	switch t := target.(type) {
	case syscall.Errno:
		return uint32(t) == uint32(e.Code)
	case *Error:
		return t.Code == e.Code
	}
	return false
}

// Errorf returns an *Error with the code and a formatted message.
func Errorf(code Errno, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// fieldAttrs gives the attribute of each field an sa.FieldError names.
var fieldAttrs = map[string]AttrType{
	sa.FieldOSeq:         AttrOSeq,
	sa.FieldReplaySeq:    AttrReplaySeq,
	sa.FieldReplayBitmap: AttrReplayBitmap,
	sa.FieldNegotiated:   AttrNegotiated,
	sa.FieldSuite:        AttrAlgName,
	sa.FieldESN:          AttrESN,
	sa.FieldKeys:         AttrEncKey,
	sa.FieldReqID:        AttrReqID,
	sa.FieldIfID:         AttrIfID,
	sa.FieldReplayWindow: AttrReplayWindow,
}

// sameSetting lists, for an attribute of fieldAttrs, the others that give
// the same setting: the algorithm (and ESN) by name or by IDs, the keys.
var sameSetting = map[AttrType][]AttrType{
	AttrAlgName: {AttrEncAlg, AttrEncKeyLen, AttrIntegAlg, AttrESN},
	AttrESN:     {AttrAlgName, AttrEncAlg},
	AttrEncKey:  {AttrIntegKey},
}

// attrFromError returns the attribute at fault in an error returned by a
// Backend for a request carrying attrs: the one of an sa.FieldError in
// its chain, or, when the request does not carry that one, the first it
// carries of those that give the same setting; else 0.
func attrFromError(err error, attrs []Attr) AttrType {
	var fe *sa.FieldError
	if !errors.As(err, &fe) {
		return 0
	}
	t := fieldAttrs[fe.Field]
	for _, alt := range append([]AttrType{t}, sameSetting[t]...) {
		for _, a := range attrs {
			if a.Type == alt {
				return alt
			}
		}
	}
	return t
}

// errnoFromError chooses the code for an error returned by a Backend: the
// code of an *Error in its chain, the number of a syscall.Errno in its
// chain, else the code backendErrno gives.
func errnoFromError(err error) Errno {
	var ce *Error
	if errors.As(err, &ce) {
		return ce.Code
	}
	var se syscall.Errno
	if errors.As(err, &se) {
		return Errno(se)
	}
	return backendErrno(err)
}
