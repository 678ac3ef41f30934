package afxdp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// State is an inbound state as the program matches it: (Dst, SPI).
type State struct {
	SPI uint32
	Dst netip.Addr
}

// SetStates makes the program's map hold exactly states: the frames of
// a state added here go to espd's sockets from now on, those of a state
// left out to the kernel's. Either way espd receives them, so the map may
// lag the state database. It is called by one goroutine at a time.
func (p *Path) SetStates(states []State) error {
	want := make(map[[4]byte][stateValueLen]byte, len(states))
	for _, s := range states {
		var k [4]byte
		binary.BigEndian.PutUint32(k[:], s.SPI)
		want[k] = stateValue(s.Dst)
	}
	var errs []error
	for k, v := range p.inMap {
		if w, ok := want[k]; ok && w == v {
			continue
		}
		if err := p.states.Delete(k); err != nil {
			errs = append(errs, fmt.Errorf("afxdp: delete state %x: %w", k, err))
			continue
		}
		delete(p.inMap, k)
	}
	for k, v := range want {
		if _, ok := p.inMap[k]; ok {
			continue
		}
		if err := p.states.Put(k, v); err != nil {
			errs = append(errs, fmt.Errorf("afxdp: add state %x: %w", k, err))
			continue
		}
		p.inMap[k] = v
	}
	return errors.Join(errs...)
}

// stateValue is the map value of a state with destination dst.
func stateValue(dst netip.Addr) (v [stateValueLen]byte) {
	dst = dst.Unmap()
	if dst.Is4() {
		binary.NativeEndian.PutUint32(v[:4], 4)
		a := dst.As4()
		copy(v[4:], a[:])
	} else {
		binary.NativeEndian.PutUint32(v[:4], 6)
		a := dst.As16()
		copy(v[4:], a[:])
	}
	return v
}
