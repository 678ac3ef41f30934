package sa

import (
	"fmt"
	"time"
)

// Lifetime limits a state. A zero field means no limit. A soft limit makes
// the state fire a soft-expire event once (the IKE daemon rekeys); a hard
// limit removes it.
type Lifetime struct {
	Bytes, Packets uint64
	// AddTime counts from AddSA, UseTime from the first packet.
	AddTime, UseTime time.Duration
}

func (l Lifetime) counted() bool { return l.Bytes != 0 || l.Packets != 0 }

// reached returns why the counters reach the byte or packet limit.
func (l *Lifetime) reached(packets, bytes uint64) (ExpireReason, bool) {
	if l.Bytes != 0 && bytes >= l.Bytes {
		return ExpireBytes, true
	}
	if l.Packets != 0 && packets >= l.Packets {
		return ExpirePackets, true
	}
	return 0, false
}

// elapsed returns why the state has lived past the time limits; added and
// used are mono() times, used 0 if never used.
func (l *Lifetime) elapsed(now, added, used int64) (ExpireReason, bool) {
	if l.AddTime > 0 && now-added >= int64(l.AddTime) {
		return ExpireAddTime, true
	}
	if l.UseTime > 0 && used != 0 && now-used >= int64(l.UseTime) {
		return ExpireUseTime, true
	}
	return 0, false
}

// State is where a state is in its life.
type State uint32

// States.
const (
	// StateLarval is an SPI reserved by AllocSPI that no AddSA has
	// filled in yet.
	StateLarval State = iota
	// StateValid is an installed state in use.
	StateValid
	// StateSoftExpired is a state past a soft limit, still in use.
	StateSoftExpired
	// StateDead is a state that was deleted or hard-expired. Lookups no
	// longer return it.
	StateDead
)

var stateNames = [...]string{StateLarval: "larval", StateValid: "valid", StateSoftExpired: "soft-expired", StateDead: "dead"}

// String returns "larval", "valid", "soft-expired" or "dead".
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint32(s))
}

// ExpireReason says which limit an expire event is about.
type ExpireReason uint8

// Expire reasons.
const (
	ExpireNone     ExpireReason = iota // acquire events
	ExpireBytes                        // Lifetime.Bytes
	ExpirePackets                      // Lifetime.Packets
	ExpireAddTime                      // Lifetime.AddTime
	ExpireUseTime                      // Lifetime.UseTime
	ExpireSequence                     // the outbound sequence number space is used up
)

var expireNames = [...]string{
	ExpireNone:     "none",
	ExpireBytes:    "byte limit",
	ExpirePackets:  "packet limit",
	ExpireAddTime:  "add-time limit",
	ExpireUseTime:  "use-time limit",
	ExpireSequence: "sequence number exhausted",
}

// String describes the reason, such as "byte limit" or "sequence number
// exhausted".
func (r ExpireReason) String() string {
	if int(r) < len(expireNames) {
		return expireNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}
