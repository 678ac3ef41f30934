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
	DropMalformed                    // esp.ErrMalformed, crypto.ErrMalformed, esp.ErrOuter; any error DropReasonOf does not know
	DropSelector                     // inner packet outside the state's selectors
	DropNextHeader                   // esp.ErrNextHeader
	DropInner                        // esp.ErrInner, esp.ErrTransport: malformed inner packet, or one transport mode cannot carry
	DropDummy                        // esp.ErrDummy: TFC dummy packet, dropped by design
	DropECN                          // esp.ErrECNDrop
	DropSequence                     // outbound sequence numbers exhausted
	DropTooBig                       // too big for the path with DF (an ICMP error goes back) or to fragment; esp.ErrTooBig, ErrHeadroom, ErrTailroom
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
// esp.Decapsulator.Open, esp.ReplayWindow.Update or a crypto.Transform:
// every error those return has a reason of its own (TestDropReasonOfTotal
// lists them from the sources). esp.ErrOuter, which only a state that
// Config.Validate refuses could cause, counts as malformed. So does an
// error none of them returns: the packet is still dropped and counted,
// without a log line per packet.
func DropReasonOf(err error) DropReason {
	r, _ := dropReasonOf(err)
	return r
}

// dropReasonOf is DropReasonOf; known is false for an error of none of
// the kinds listed.
func dropReasonOf(err error) (r DropReason, known bool) {
	switch {
	case errors.Is(err, esp.ErrReplay):
		return DropReplay, true
	case errors.Is(err, crypto.ErrAuthentication):
		return DropIntegrity, true
	case errors.Is(err, esp.ErrPadding):
		return DropPadding, true
	case errors.Is(err, esp.ErrMalformed), errors.Is(err, crypto.ErrMalformed), errors.Is(err, esp.ErrOuter):
		return DropMalformed, true
	case errors.Is(err, esp.ErrNextHeader):
		return DropNextHeader, true
	case errors.Is(err, esp.ErrInner), errors.Is(err, esp.ErrTransport):
		return DropInner, true
	case errors.Is(err, esp.ErrDummy):
		return DropDummy, true
	case errors.Is(err, esp.ErrECNDrop):
		return DropECN, true
	case errors.Is(err, esp.ErrTooBig), errors.Is(err, esp.ErrHeadroom), errors.Is(err, esp.ErrTailroom):
		return DropTooBig, true
	}
	return DropMalformed, false
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
