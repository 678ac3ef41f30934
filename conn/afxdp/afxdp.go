// Package afxdp is espd's receive path below the socket API: an XDP
// program on each outer device hands the frames of espd's own inbound
// states (raw ESP and, if asked, ESP-in-UDP) to AF_XDP sockets, one per
// receive queue, and passes every other frame to the kernel. Its
// receivers are conn.Receivers beside the kernel's sockets, which keep
// receiving what the program passes (fragments, IKE, keepalives, states
// not yet in its map, devices or queues without a socket).
//
// The program is attached through a BPF link, so it goes with the
// process. docs/afxdp.md says what changes for the firewall.
package afxdp

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/espd/espd/conn"
)

// Config says where to attach.
type Config struct {
	// Devices are the outer interfaces to receive on.
	Devices []string
	// EncapPort, if not 0, also hands over ESP-in-UDP to this port.
	EncapPort uint16
	// Frames is the number of UMEM frames (and ring entries) per queue,
	// rounded up to a power of two; 0 means DefaultFrames.
	Frames int
	// MaxStates bounds the number of inbound states in the program's map;
	// 0 means DefaultMaxStates.
	MaxStates int
	// Mode is how the program is attached: ModeNative, ModeGeneric, or
	// ModeAuto (""): generic on a veth, where it measured faster
	// (docs/afxdp.md), native elsewhere; each falls back to the other.
	Mode string
}

// Attach modes (Config.Mode, Attachment.Mode).
const (
	ModeAuto    = ""
	ModeNative  = "native"
	ModeGeneric = "generic"
)

var attachFlags = map[string]link.XDPAttachFlags{ModeNative: link.XDPDriverMode, ModeGeneric: link.XDPGenericMode}

// attachOrder returns the modes to try, in order, for mode on a device
// of the link type typ.
func attachOrder(mode, typ string) []string {
	switch {
	case mode == ModeNative || mode == ModeGeneric:
		return []string{mode}
	case typ == "veth":
		return []string{ModeGeneric, ModeNative}
	}
	return []string{ModeNative, ModeGeneric}
}

// Defaults of Config.
const (
	DefaultFrames    = 8192 // 16 MiB a queue, twice the sockets' SO_RCVBUF
	DefaultMaxStates = 65536
)

// Attachment says how a device was attached.
type Attachment struct {
	Device string
	// Mode is ModeNative (the driver runs the program) or ModeGeneric
	// (the kernel runs it on each socket buffer).
	Mode string
	// Queues is the number of receive queues with a socket; ZeroCopy
	// reports that they bound in zero-copy mode (else copy mode).
	Queues   int
	ZeroCopy bool
	// Frames is the number of UMEM frames a queue got: Config.Frames, or
	// fewer where RLIMIT_MEMLOCK holds less (openFitting).
	Frames int
}

// Path is the AF_XDP receive path on a set of devices.
type Path struct {
	states   *ebpf.Map
	maps     []*ebpf.Map
	progs    []*ebpf.Program
	links    []link.Link
	socks    []*socket
	recv     []conn.Receiver
	attached []Attachment
	counts   counts
	inMap    map[[4]byte][stateValueLen]byte // what SetStates put in states

	mu sync.Mutex // Stats against Close
}

// counts are the receivers' own counters.
type counts struct {
	frames, reads atomic.Uint64
}

// ErrUnavailable wraps every reason the path cannot be opened: no BPF or
// AF_XDP in the kernel, a missing capability, a device that refuses XDP.
// The caller falls back to the sockets alone.
var ErrUnavailable = errors.New("afxdp: unavailable")

// Open loads the program, attaches it to every device and binds a socket
// to each of its receive queues. It fails, closing what it opened, if any
// device cannot be attached.
func Open(cfg Config) (_ *Path, err error) {
	if len(cfg.Devices) == 0 {
		return nil, fmt.Errorf("%w: no device", ErrUnavailable)
	}
	if _, ok := attachFlags[cfg.Mode]; !ok && cfg.Mode != ModeAuto {
		return nil, fmt.Errorf("afxdp: attach mode %q: want native, generic or auto", cfg.Mode)
	}
	frames := cfg.Frames
	if frames <= 0 {
		frames = DefaultFrames
	}
	frames = 1 << bits.Len(uint(frames-1))
	maxStates := cfg.MaxStates
	if maxStates <= 0 {
		maxStates = DefaultMaxStates
	}
	p := &Path{inMap: map[[4]byte][stateValueLen]byte{}}
	defer func() {
		if err != nil {
			p.Close()
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}()
	p.states, err = ebpf.NewMap(&ebpf.MapSpec{
		Name: "espd_states", Type: ebpf.Hash, KeySize: 4, ValueSize: stateValueLen,
		MaxEntries: uint32(maxStates),
	})
	if err != nil {
		return nil, fmt.Errorf("states map: %w", needs(err))
	}
	for _, dev := range cfg.Devices {
		a, err := p.attach(dev, cfg.Mode, cfg.EncapPort, uint32(frames))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", dev, err)
		}
		p.attached = append(p.attached, a)
	}
	return p, nil
}

// attach attaches the program to dev and binds its queues' sockets.
func (p *Path) attach(dev, mode string, encapPort uint16, frames uint32) (Attachment, error) {
	a := Attachment{Device: dev}
	l, err := netlink.LinkByName(dev)
	if err != nil {
		return a, err
	}
	attrs := l.Attrs()
	queues := max(attrs.NumRxQueues, 1)
	xsks, err := ebpf.NewMap(&ebpf.MapSpec{
		Name: "espd_xsks", Type: ebpf.XSKMap, KeySize: 4, ValueSize: 4, MaxEntries: uint32(queues),
	})
	if err != nil {
		return a, fmt.Errorf("socket map: %w", needs(err))
	}
	p.maps = append(p.maps, xsks)
	prog, err := loadProgram(p.states, xsks, encapPort, maxFrame, xdpPass)
	if err != nil {
		return a, needs(err)
	}
	p.progs = append(p.progs, prog)
	var lk link.Link
	for _, mode := range attachOrder(mode, l.Type()) {
		lk, err = link.AttachXDP(link.XDPOptions{Program: prog, Interface: attrs.Index, Flags: attachFlags[mode]})
		if err == nil {
			a.Mode = mode
			break
		}
	}
	if err != nil {
		return a, fmt.Errorf("attach XDP: %w", needs(err))
	}
	p.links = append(p.links, lk)
	a.ZeroCopy = true
	for q := range queues {
		s, err := openFitting(attrs.Index, q, frames)
		if err != nil {
			if q > 0 && errors.Is(err, unix.EINVAL) {
				break // fewer queues in use than allocated; the rest pass to the kernel
			}
			return a, needs(err)
		}
		p.socks = append(p.socks, s)
		if err := xsks.Put(uint32(q), uint32(s.file.Fd())); err != nil {
			return a, fmt.Errorf("socket map: %w", err)
		}
		a.Queues++
		a.ZeroCopy = a.ZeroCopy && s.zeroCopy
		a.Frames = int(s.frames)
		p.recv = append(p.recv, newReceiver(s, encapPort, &p.counts))
	}
	return a, nil
}

// minFrames is the fewest UMEM frames a queue takes (1 MiB).
const minFrames = 512

// openFitting opens a socket with frames UMEM frames, or with half as
// many, down to minFrames, while the kernel refuses to pin that much
// under RLIMIT_MEMLOCK (ENOBUFS; a process with CAP_IPC_LOCK has no
// limit).
func openFitting(ifindex, queue int, frames uint32) (*socket, error) {
	for {
		s, err := openSocket(ifindex, queue, frames)
		if err == nil || !errors.Is(err, unix.ENOBUFS) || frames <= minFrames {
			return s, err
		}
		frames /= 2
	}
}

// needs says which capability a permission error lacks.
func needs(err error) error {
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		return fmt.Errorf("%w (needs CAP_BPF, CAP_NET_ADMIN and CAP_NET_RAW)", err)
	}
	return err
}

// Receivers returns one conn.Receiver per bound queue.
func (p *Path) Receivers() []conn.Receiver { return p.recv }

// Attached returns how each device was attached.
func (p *Path) Attached() []Attachment { return p.attached }

// Stats are the path's counters.
type Stats struct {
	// Frames counts the frames the receivers took, Reads the batches.
	Frames, Reads uint64
	// Dropped counts frames the kernel dropped for want of a free UMEM
	// frame or RX ring entry (XDP_STATISTICS rx_dropped, rx_ring_full
	// and rx_fill_ring_empty_descs, summed over the sockets).
	Dropped uint64
}

// Stats returns the path's counters.
func (p *Path) Stats() Stats {
	st := Stats{Frames: p.counts.frames.Load(), Reads: p.counts.reads.Load()}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.socks {
		if k, err := s.stats(); err == nil {
			st.Dropped += k.Rx_dropped + k.Rx_ring_full + k.Rx_fill_ring_empty_descs
		}
	}
	return st
}

// Close detaches the programs and closes the sockets; blocked Receives
// return an error. Frames in flight at that moment are lost, as in a
// socket's queue.
func (p *Path) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, l := range p.links {
		errs = append(errs, l.Close())
	}
	p.links = nil
	for _, r := range p.recv {
		errs = append(errs, r.Close())
	}
	p.recv, p.socks = nil, nil
	for _, pr := range p.progs {
		errs = append(errs, pr.Close())
	}
	p.progs = nil
	for _, m := range p.maps {
		errs = append(errs, m.Close())
	}
	p.maps = nil
	if p.states != nil {
		errs = append(errs, p.states.Close())
		p.states = nil
	}
	return errors.Join(errs...)
}
