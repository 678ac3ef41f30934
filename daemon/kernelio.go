package daemon

import (
	"errors"
	"log/slog"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/conn/afxdp"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/routing"
	"github.com/espd/espd/tun"
)

// DefaultRecvBuffer is the outer sockets' forced SO_RCVBUF. The kernel's
// default (about 200 KiB) holds a few hundred full-size ESP packets: a
// burst from a TSO sender overflows it before the reader's next recvmmsg.
const DefaultRecvBuffer = 8 << 20

// IOConfig configures what espd creates in the kernel for the data plane:
// the TUN device, the policy routing into it and the outer sockets. The
// zero value is usable.
type IOConfig struct {
	// TUN is the cleartext interface (name, MTU, io_uring, queue).
	TUN tun.Config
	// Table, Mark and RulePriority configure the routes and rules
	// (package routing); zero means routing's defaults. Mark is also the
	// SO_MARK of the outer sockets.
	Table        int
	Mark         uint32
	RulePriority int
	// EncapPort is the ESP-in-UDP port (RFC 3948); 0 means 4500.
	EncapPort uint16
	// NoIPv6 opens no IPv6 sockets and installs no IPv6 rule or route.
	NoIPv6 bool
	// HoldFile is where the held prefixes are recorded for the next boot
	// (routing.Config.HoldFile); "" records nothing.
	HoldFile string
	// RecvBuffer is the outer sockets' SO_RCVBUF (forced); 0 means
	// DefaultRecvBuffer, negative leaves the kernel's default.
	RecvBuffer int
	// NoGSO sends ESP-in-UDP packet by packet and receives it without
	// UDP_GRO (conn.SocketConfig).
	NoGSO bool
	// XDP names the outer devices on which espd receives the ESP of its
	// inbound states through AF_XDP (package afxdp), beside the sockets;
	// if that cannot be opened, espd logs why and uses the sockets alone.
	XDP []string
	// XDPEncap also takes ESP-in-UDP through AF_XDP.
	XDPEncap bool
	// XDPMode is afxdp.Config.Mode.
	XDPMode string

	// holdFileError is told a failed write of HoldFile (Daemon.stateWriteFailed).
	holdFileError func(error)
}

func (c *IOConfig) setDefaults() {
	if c.TUN.MTU == 0 {
		c.TUN.MTU = tun.DefaultMTU
	}
	if c.Mark == 0 {
		c.Mark = routing.DefaultMark
	}
	if c.EncapPort == 0 {
		c.EncapPort = conn.DefaultEncapPort
	}
	if c.RecvBuffer == 0 {
		c.RecvBuffer = DefaultRecvBuffer
	}
}

// kernelIO is what openIO created: the data plane's TUN and sockets, and
// the router that owns espd's routes and rules.
type kernelIO struct {
	tun    *tun.Device
	router *routing.Router
	socks  *conn.Sockets
	xdp    *afxdp.Path // nil unless IOConfig.XDP and it opened
}

// openIO creates the TUN device, the policy routing and the outer sockets
// in the calling thread's network namespace; batch is the data plane's
// batch size. On error it closes what it opened.
func openIO(cfg *IOConfig, batch int, log *slog.Logger) (_ *kernelIO, err error) {
	k := &kernelIO{}
	defer func() {
		if err != nil {
			k.close()
		}
	}()
	if k.tun, err = tun.Create(cfg.TUN); err != nil {
		return nil, err
	}
	cfg.TUN.Name = k.tun.Name()
	if err := k.tun.URingErr(); err != nil && !errors.Is(err, tun.ErrURingOff) {
		log.Warn("TUN writes without io_uring: one writev(2) per packet the TUN cannot coalesce (under systemd, SystemCallFilter must allow io_uring_setup and io_uring_enter)", "err", err)
	}
	k.router, err = routing.New(routing.Config{
		LinkIndex: k.tun.Index(), LinkName: k.tun.Name(),
		MTU: k.tun.MTU(), TransportMTU: dataplane.BufferSize - dataplane.MaxFraming,
		Table: cfg.Table, Mark: cfg.Mark, Priority: cfg.RulePriority, NoIPv6: cfg.NoIPv6,
		HoldFile:      cfg.HoldFile,
		HoldFileError: cfg.holdFileError,
	})
	if err != nil {
		return nil, err
	}
	cfg.Table = k.router.Table()
	if n := k.router.Adopted(); n > 0 {
		log.Info("kept the routes a previous espd left: the prefixes it held stay closed and its bypasses open until a policy claims them (espd --cleanup removes them for good)",
			"prefixes", n, "table", cfg.Table)
	}
	k.socks, err = conn.OpenSockets(conn.SocketConfig{
		Mark: cfg.Mark, EncapPort: cfg.EncapPort, NoIPv6: cfg.NoIPv6,
		Batch: batch, RecvBuffer: cfg.RecvBuffer, NoGSO: cfg.NoGSO,
	})
	if err != nil {
		return nil, err
	}
	k.xdp = openXDP(cfg, log)
	return k, nil
}

// dataplaneIO is the data plane's share of k.
func (k *kernelIO) dataplaneIO() dataplane.IO {
	var bind conn.Bind = k.socks
	if k.xdp != nil {
		bind = newXDPBind(k.socks, k.xdp)
	}
	return dataplane.IO{TUN: k.tun, Bind: bind, PathMTU: k.router.PathMTU, DeliverIKE: k.socks.DeliverIKE}
}

// close closes the router first (routes into the TUN go, holds stay:
// routing.Router.Close), then the TUN and the sockets. After the data
// plane started, it owns the TUN and the sockets: closeRouter only.
func (k *kernelIO) close() error {
	var errs []error
	errs = append(errs, k.closeRouter())
	if k.tun != nil {
		errs = append(errs, k.tun.Close())
	}
	if k.xdp != nil {
		errs = append(errs, k.xdp.Close())
	}
	if k.socks != nil {
		errs = append(errs, k.socks.Close())
	}
	return errors.Join(errs...)
}

// closeRouter closes the router: the routes into the TUN go, but while a
// protect or drop policy's prefix is held its blackhole route, the
// bypasses' throw routes and the rules stay, so that nothing it protected
// leaves in clear while espd is away.
func (k *kernelIO) closeRouter() error {
	if k.router == nil {
		return nil
	}
	return k.router.Close()
}
