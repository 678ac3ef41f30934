package sa

import "fmt"

// Direction is the direction of a policy or a state, numbered as XFRM
// numbers policy directions.
type Direction uint8

// Directions. States are DirIn or DirOut; policies may also be DirFwd
// (traffic forwarded through this host, checked like DirIn).
const (
	DirIn Direction = iota
	DirOut
	DirFwd
	numDirections
)

var directionNames = [...]string{DirIn: "in", DirOut: "out", DirFwd: "fwd"}

// String returns "in", "out" or "fwd".
func (d Direction) String() string {
	if d < numDirections {
		return directionNames[d]
	}
	return fmt.Sprintf("dir(%d)", uint8(d))
}

// ParseDirection parses "in", "out" or "fwd".
func ParseDirection(s string) (Direction, error) {
	for d, n := range directionNames {
		if n == s {
			return Direction(d), nil
		}
	}
	return 0, fmt.Errorf("sa: unknown direction %q (want in, out or fwd)", s)
}

// Action is what a policy does with the traffic its selector matches.
type Action uint8

// Actions.
const (
	// ActionProtect sends outbound traffic through the newest outbound
	// state of the policy's reqid (an acquire if there is none) and, for
	// inbound traffic, requires that it arrived through ESP.
	ActionProtect Action = iota
	// ActionBypass lets the traffic pass in clear.
	ActionBypass
	// ActionDrop discards the traffic.
	ActionDrop
	numActions
)

var actionNames = [...]string{ActionProtect: "protect", ActionBypass: "bypass", ActionDrop: "drop"}

// String returns "protect", "bypass" or "drop".
func (a Action) String() string {
	if a < numActions {
		return actionNames[a]
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// ParseAction parses "protect", "bypass" or "drop" (and the XFRM and
// strongSwan synonyms "ipsec", "allow", "pass", "block", "discard").
func ParseAction(s string) (Action, error) {
	switch s {
	case "protect", "ipsec":
		return ActionProtect, nil
	case "bypass", "allow", "pass":
		return ActionBypass, nil
	case "drop", "block", "discard":
		return ActionDrop, nil
	}
	return 0, fmt.Errorf("sa: unknown policy action %q (want protect, bypass or drop)", s)
}
