package afxdp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// State is an inbound state as the program matches it: (Dst, SPI), and
// the peer's address Src, or any source if Src is not valid.
type State struct {
	SPI      uint32
	Dst, Src netip.Addr
}

// SetStates makes the program's map hold exactly states: the frames of
// a state added here go to espd's sockets from now on, those of a state
// left out to the kernel's. Either way espd receives them, so the map may
// lag the state database. It is called by one goroutine at a time.
func (p *Path) SetStates(states []State) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.states == nil {
		return errors.New("afxdp: path closed")
	}
	want := make(map[[4]byte][stateValueLen]byte, len(states))
	for _, s := range states {
		var k [4]byte
		binary.BigEndian.PutUint32(k[:], s.SPI)
		want[k] = stateValue(s.Dst, s.Src)
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

// stateValue is the map value of a state with destination dst and peer
// src (any if not valid).
func stateValue(dst, src netip.Addr) (v [stateValueLen]byte) {
	dst, src = dst.Unmap(), src.Unmap()
	word := uint32(6)
	if dst.Is4() {
		word = 4
	}
	if !src.IsValid() || src.IsUnspecified() {
		word |= anySource
	}
	binary.NativeEndian.PutUint32(v[:4], word)
	put := func(b []byte, a netip.Addr) {
		if a.Is4() {
			a4 := a.As4()
			copy(b, a4[:])
		} else if a.Is6() {
			a16 := a.As16()
			copy(b, a16[:])
		}
	}
	put(v[4:20], dst)
	put(v[20:36], src)
	return v
}
