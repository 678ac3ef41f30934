package daemon

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/conn/afxdp"
	"github.com/espd/espd/sa"
)

// xdpBind is the outer sockets with the AF_XDP receivers beside theirs
// (IOConfig.XDP): the data plane reads both and sends through the
// sockets.
type xdpBind struct {
	*conn.Sockets
	path *afxdp.Path
	recv []conn.Receiver
}

func newXDPBind(s *conn.Sockets, p *afxdp.Path) *xdpBind {
	return &xdpBind{Sockets: s, path: p, recv: append(append([]conn.Receiver(nil), s.Receivers()...), p.Receivers()...)}
}

// Receivers implements conn.Bind.
func (b *xdpBind) Receivers() []conn.Receiver { return b.recv }

// Close implements conn.Bind: the programs go first, so that the kernel's
// sockets take every frame until they close too.
func (b *xdpBind) Close() error {
	return errors.Join(b.path.Close(), b.Sockets.Close())
}

// openXDP opens the AF_XDP path of cfg, or returns nil after logging why
// espd receives through the sockets alone.
func openXDP(cfg *IOConfig, log *slog.Logger) *afxdp.Path {
	if len(cfg.XDP) == 0 {
		return nil
	}
	xcfg := afxdp.Config{Devices: cfg.XDP, Mode: cfg.XDPMode}
	if cfg.XDPEncap {
		xcfg.EncapPort = cfg.EncapPort
	}
	p, err := afxdp.Open(xcfg)
	if err != nil {
		log.Warn("AF_XDP receive unavailable: receiving through the sockets alone (espd_xdp_fallback is 1)",
			"devices", cfg.XDP, "err", err)
		return nil
	}
	for _, a := range p.Attached() {
		log.Info("receiving ESP through AF_XDP", "device", a.Device, "mode", a.Mode,
			"queues", a.Queues, "zerocopy", a.ZeroCopy, "frames", a.Frames, "esp_in_udp", cfg.XDPEncap)
		if a.Frames < afxdp.DefaultFrames {
			log.Warn("AF_XDP frames cut to what RLIMIT_MEMLOCK lets the kernel pin: frames may be dropped under load (raise LimitMEMLOCK=, docs/afxdp.md)",
				"device", a.Device, "frames", a.Frames, "want", afxdp.DefaultFrames)
		}
	}
	return p
}

// xdpSyncInterval is how often the program's map follows the inbound
// states. A state not yet in it is received through the sockets.
const xdpSyncInterval = 250 * time.Millisecond

// syncXDP keeps p's map equal to db's inbound states until ctx is done.
func syncXDP(ctx context.Context, db *sa.DB, p *afxdp.Path, log *slog.Logger) {
	t := time.NewTicker(xdpSyncInterval)
	defer t.Stop()
	var states []afxdp.State
	failing := false
	for {
		states = inboundStates(db, states[:0])
		if err := p.SetStates(states); err != nil {
			if !failing {
				log.Warn("AF_XDP state map not updated; the states left out are received through the sockets", "err", err)
			}
			failing = true
		} else {
			failing = false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// inboundStates appends db's live inbound states to states.
func inboundStates(db *sa.DB, states []afxdp.State) []afxdp.State {
	for _, s := range db.SAs() {
		if s.Dir() == sa.DirIn && s.Alive() {
			states = append(states, afxdp.State{SPI: s.SPI(), Dst: s.Dst(), Src: s.Peer().Addr()})
		}
	}
	return states
}
