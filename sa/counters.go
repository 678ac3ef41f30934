package sa

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/espd/espd/crypto"
	"github.com/espd/espd/esp"
)

// DropReason says why the data path dropped packets of a state.
type DropReason uint8

// Drop reasons; DropReasonOf maps esp and crypto errors to them.
const (
	DropReplay     DropReason = iota // esp.ErrReplay
	DropIntegrity                    // crypto.ErrAuthentication
	DropPadding                      // esp.ErrPadding
	DropMalformed                    // esp.ErrMalformed, crypto.ErrMalformed
	DropSelector                     // inner packet outside the state's selectors
	DropNextHeader                   // esp.ErrNextHeader
	DropInner                        // esp.ErrInner: malformed inner packet
	DropDummy                        // esp.ErrDummy: TFC dummy packet, dropped by design
	DropECN                          // esp.ErrECNDrop
	DropSequence                     // outbound sequence numbers exhausted
	DropTooBig                       // esp.ErrTooBig, ErrHeadroom, ErrTailroom
	DropOther                        // anything else
	NumDropReasons
)

var dropNames = [...]string{
	DropReplay:     "replay",
	DropIntegrity:  "integrity",
	DropPadding:    "padding",
	DropMalformed:  "malformed",
	DropSelector:   "selector",
	DropNextHeader: "next-header",
	DropInner:      "inner",
	DropDummy:      "dummy",
	DropECN:        "ecn",
	DropSequence:   "sequence",
	DropTooBig:     "too-big",
	DropOther:      "other",
}

// String returns a short name such as "replay" or "integrity", fit for a
// metric label.
func (r DropReason) String() string {
	if r < NumDropReasons {
		return dropNames[r]
	}
	return fmt.Sprintf("drop(%d)", uint8(r))
}

// DropReasonOf returns the drop reason for an error of esp.Encapsulate,
// esp.Decapsulate or a crypto.Transform.
func DropReasonOf(err error) DropReason {
	switch {
	case errors.Is(err, esp.ErrReplay):
		return DropReplay
	case errors.Is(err, crypto.ErrAuthentication):
		return DropIntegrity
	case errors.Is(err, esp.ErrPadding):
		return DropPadding
	case errors.Is(err, esp.ErrMalformed), errors.Is(err, crypto.ErrMalformed):
		return DropMalformed
	case errors.Is(err, esp.ErrNextHeader):
		return DropNextHeader
	case errors.Is(err, esp.ErrInner):
		return DropInner
	case errors.Is(err, esp.ErrDummy):
		return DropDummy
	case errors.Is(err, esp.ErrECNDrop):
		return DropECN
	case errors.Is(err, esp.ErrTooBig), errors.Is(err, esp.ErrHeadroom), errors.Is(err, esp.ErrTailroom):
		return DropTooBig
	}
	return DropOther
}

// Stats is a snapshot of a state's counters.
type Stats struct {
	State State
	// Packets and Bytes count what went through the state successfully
	// (inner bytes, as Account was given them).
	Packets, Bytes uint64
	// Drops counts dropped packets by DropReason.
	Drops [NumDropReasons]uint64
	// AddTime is when the state was added; FirstUse and LastUse when it
	// first and last carried a packet (zero if never; LastUse is as fine
	// as a batch).
	AddTime, FirstUse, LastUse time.Time
	// SeqOut is the last outbound sequence number handed out (0: none).
	SeqOut uint64
}

// cacheLinePad keeps the fields around it on separate cache lines.
type cacheLinePad struct{ _ [64]byte }

// paddedCounter is an atomic counter alone on its cache line.
type paddedCounter struct {
	atomic.Uint64
	_ [56]byte
}
