package wire

import (
	"math"
	"time"

	"github.com/espd/espd/esp"
	"github.com/espd/espd/sa"
)

// The wire numbers of the protocol are fixed by docs/control-protocol.md;
// these tables tie them to the Go constants of sa and esp, whatever their
// values.

var dirToWire = map[sa.Direction]uint32{sa.DirIn: DirIn, sa.DirOut: DirOut, sa.DirFwd: DirFwd}

func dirFromWire(v uint32) (sa.Direction, bool) { return fromWire(dirToWire, v) }

var actionToWire = map[sa.Action]uint32{sa.ActionProtect: ActionProtect, sa.ActionBypass: ActionBypass, sa.ActionDrop: ActionDrop}

func actionFromWire(v uint32) (sa.Action, bool) { return fromWire(actionToWire, v) }

var modeToWire = map[sa.Mode]uint32{sa.ModeTunnel: ModeTunnel, sa.ModeTransport: ModeTransport}

func modeFromWire(v uint32) (sa.Mode, bool) { return fromWire(modeToWire, v) }

var dfToWire = map[esp.DFMode]uint32{esp.DFCopy: DFCopy, esp.DFSet: DFSet, esp.DFClear: DFClear}

func dfFromWire(v uint32) (esp.DFMode, bool) { return fromWire(dfToWire, v) }

var stateToWire = map[sa.State]uint32{
	sa.StateLarval: StateLarval, sa.StateValid: StateValid,
	sa.StateSoftExpired: StateSoftExpired, sa.StateDead: StateDead,
}

func stateFromWire(v uint32) (sa.State, bool) { return fromWire(stateToWire, v) }

var reasonToWire = map[sa.ExpireReason]uint32{
	sa.ExpireBytes: ReasonBytes, sa.ExpirePackets: ReasonPackets,
	sa.ExpireAddTime: ReasonAddTime, sa.ExpireUseTime: ReasonUseTime,
	sa.ExpireSequence: ReasonSeq,
}

func reasonFromWire(v uint32) (sa.ExpireReason, bool) { return fromWire(reasonToWire, v) }

// fromWire finds the Go value that table maps to the wire number v; false
// if none does.
func fromWire[T comparable](table map[T]uint32, v uint32) (T, bool) {
	for k, w := range table {
		if w == v {
			return k, true
		}
	}
	var zero T
	return zero, false
}

// timeToWire encodes a time as nanoseconds since the Unix epoch; the zero
// time (and anything before the epoch) is 0.
func timeToWire(t time.Time) uint64 {
	if t.IsZero() || t.Before(time.Unix(0, 0)) {
		return 0
	}
	return uint64(t.UnixNano())
}

// timeFromWire decodes timeToWire; 0 is the zero time.
func timeFromWire(v uint64) time.Time {
	if v == 0 || v > math.MaxInt64 {
		return time.Time{}
	}
	return time.Unix(0, int64(v))
}

// durationFromWire decodes nanoseconds; false if they overflow a Duration.
func durationFromWire(v uint64) (time.Duration, bool) {
	if v > math.MaxInt64 {
		return 0, false
	}
	return time.Duration(v), true
}

// durationToWire encodes a Duration as nanoseconds; negative is 0.
func durationToWire(d time.Duration) uint64 {
	if d < 0 {
		return 0
	}
	return uint64(d)
}
