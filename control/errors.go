package control

import (
	"errors"
	"syscall"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/sa"
)

// fieldAttrs gives the attribute of each field an sa.FieldError names.
var fieldAttrs = map[string]wire.AttrType{
	sa.FieldOSeq:         wire.AttrOSeq,
	sa.FieldReplaySeq:    wire.AttrReplaySeq,
	sa.FieldReplayBitmap: wire.AttrReplayBitmap,
	sa.FieldNegotiated:   wire.AttrNegotiated,
	sa.FieldSuite:        wire.AttrAlgName,
	sa.FieldESN:          wire.AttrESN,
	sa.FieldKeys:         wire.AttrEncKey,
	sa.FieldReqID:        wire.AttrReqID,
	sa.FieldIfID:         wire.AttrIfID,
	sa.FieldMode:         wire.AttrMode,
	sa.FieldReplayWindow: wire.AttrReplayWindow,
}

// sameSetting lists, for an attribute of fieldAttrs, the others that give
// the same setting: the algorithm (and ESN) by name or by IDs, the keys.
var sameSetting = map[wire.AttrType][]wire.AttrType{
	wire.AttrAlgName: {wire.AttrEncAlg, wire.AttrEncKeyLen, wire.AttrIntegAlg, wire.AttrESN},
	wire.AttrESN:     {wire.AttrAlgName, wire.AttrEncAlg},
	wire.AttrEncKey:  {wire.AttrIntegKey},
}

// attrFromError returns the attribute at fault in an error returned by a
// Backend for a request carrying attrs: the one of an sa.FieldError in
// its chain, or, when the request does not carry that one, the first it
// carries of those that give the same setting; else 0.
func attrFromError(err error, attrs []wire.Attr) wire.AttrType {
	var fe *sa.FieldError
	if !errors.As(err, &fe) {
		return 0
	}
	t := fieldAttrs[fe.Field]
	for _, alt := range append([]wire.AttrType{t}, sameSetting[t]...) {
		for _, a := range attrs {
			if a.Type == alt {
				return alt
			}
		}
	}
	return t
}

// errnoFromError chooses the code for an error returned by a Backend: the
// code of a *wire.Error in its chain, the number of a syscall.Errno in its
// chain, else the code backendErrno gives.
func errnoFromError(err error) wire.Errno {
	var ce *wire.Error
	if errors.As(err, &ce) {
		return ce.Code
	}
	var se syscall.Errno
	if errors.As(err, &se) {
		return wire.Errno(se)
	}
	return backendErrno(err)
}
