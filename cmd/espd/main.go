// Command espd is the userspace IPsec ESP data plane daemon: it carries the
// cleartext of a TUN device through ESP tunnels to peer gateways. States
// and policies come from its control socket (espctl, the strongSwan plugin)
// and from an optional configuration file (docs/config.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/espd/espd/conn"
	"github.com/espd/espd/conn/afxdp"
	"github.com/espd/espd/control"
	"github.com/espd/espd/daemon"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/tun"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "espd:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("espd", flag.ContinueOnError)
	var (
		opts      daemon.Options
		dp        = &opts.Dataplane
		kio       = &opts.IO
		udpPort   uint
		mark      uint
		logFormat string
		logLevel  string
		ikePort   uint
		pprofAddr string
		procs     int
	)
	fs.StringVar(&kio.TUN.Name, "tun", tun.DefaultName, "name of the cleartext TUN device")
	fs.IntVar(&kio.TUN.MTU, "mtu", tun.DefaultMTU, "MTU of the TUN device")
	fs.BoolVar(&kio.TUN.NoURing, "tun-no-uring", false, "write the TUN with writev(2), not io_uring")
	fs.IntVar(&kio.TUN.TxQueueLen, "tun-txqueuelen", tun.DefaultTxQueueLen, "length of the TUN's transmit queue, in packets")
	fs.IntVar(&dp.OuterMTU, "outer-mtu", 0, "MTU of the path to the peers (0: the route's MTU)")
	fs.IntVar(&dp.Workers, "workers", runtime.GOMAXPROCS(0), "crypto worker goroutines (0: readers run their batches to completion)")
	fs.IntVar(&dp.HandOffBelow, "hand-off-below", dataplane.DefaultHandOffBelow, "MB/s: hand batches to the workers while a direction's crypto is slower (0: always)")
	fs.IntVar(&procs, "procs", 0, "GOMAXPROCS (0: $GOMAXPROCS, else chosen by how batches run)")
	fs.UintVar(&udpPort, "udp-port", uint(conn.DefaultEncapPort), "ESP-in-UDP port (RFC 3948)")
	fs.UintVar(&mark, "mark", 0, "SO_MARK of espd's outer packets (0: default)")
	fs.IntVar(&kio.Table, "table", 0, "routing table of the routes into the TUN (0: default)")
	fs.IntVar(&kio.RecvBuffer, "recv-buffer", daemon.DefaultRecvBuffer, "forced SO_RCVBUF of the outer sockets, bytes (negative: kernel default)")
	fs.BoolVar(&kio.NoIPv6, "no-ipv6", false, "open no IPv6 sockets and install no IPv6 rule")
	fs.Func("xdp", "receive ESP on these outer `devices` (comma-separated) through AF_XDP", func(v string) error {
		kio.XDP = nil
		for _, d := range strings.Split(v, ",") {
			if d = strings.TrimSpace(d); d != "" {
				kio.XDP = append(kio.XDP, d)
			}
		}
		return nil
	})
	fs.BoolVar(&kio.XDPEncap, "xdp-udp", false, "with --xdp, also receive ESP-in-UDP through AF_XDP")
	fs.Func("xdp-mode", "how --xdp attaches: auto, native or generic", func(v string) error {
		if v != "auto" && v != afxdp.ModeNative && v != afxdp.ModeGeneric {
			return fmt.Errorf("want auto, native or generic")
		}
		kio.XDPMode = strings.TrimPrefix(v, "auto")
		return nil
	})
	fs.DurationVar(&dp.Keepalive, "keepalive", dataplane.DefaultKeepalive, "NAT keepalive interval for UDP-encapsulated SAs (negative: off)")
	fs.StringVar(&opts.Control.Path, "socket", control.DefaultSocketPath, "control socket path")
	fs.StringVar(&opts.Control.Group, "socket-group", "", "group (name or gid) that may use the control socket too")
	fs.StringVar(&opts.ConfigPath, "config", "", "configuration file of static SAs and policies, re-read on SIGHUP")
	fs.StringVar(&opts.StateDir, "state-dir", daemon.DefaultStateDir, "durable record of outbound sequence numbers (persistent storage, one espd per directory)")
	fs.StringVar(&opts.MetricsListen, "metrics-listen", "", "address of the Prometheus /metrics endpoint (e.g. 127.0.0.1:9585)")
	fs.Func("metrics-per-sa", "also export per-state series for at most `N` states (0: totals only)", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("want a number of states, 0 or more")
		}
		opts.MetricsPerSA = n
		return nil
	})
	fs.BoolVar(&opts.IKEHandoff, "ike-handoff", false, "own UDP 500 and 4500 and hand IKE to charon's espd plugin")
	fs.UintVar(&ikePort, "ike-port", 500, "IKE port with --ike-handoff")
	fs.IntVar(&opts.Pair.Node, "pair-node", 0, "make espd node 1 or 2 of an active/standby gateway pair (docs/ha.md); it starts standing by (0: no pair)")
	fs.StringVar(&opts.Pair.Listen, "pair-listen", "", "with --pair-node, this node's UDP address on the pair link (host:port)")
	fs.StringVar(&opts.Pair.Peer, "pair-peer", "", "with --pair-node, the other node's UDP address on the pair link (host:port)")
	fs.StringVar(&opts.Pair.KeyFile, "pair-key-file", "", "with --pair-node, the file of the pair link's key: 64 hex digits, root:espd 0640, not a link (docs/ha.md)")
	fs.Func("pair-local-addr", "with --pair-node, an `address` of this node alone, whose states are not the pair's (repeatable; docs/ha.md)", func(v string) error {
		a, err := netip.ParseAddr(v)
		if err != nil {
			return err
		}
		opts.Pair.LocalAddrs = append(opts.Pair.LocalAddrs, a.Unmap())
		return nil
	})
	fs.StringVar(&opts.Pair.RoleFile, "pair-role-file", "", "with --pair-node, the file holding the role (active or standby) to take at start, which the VRRP notify script writes")
	fs.StringVar(&pprofAddr, "pprof-listen", "", "debugging: serve net/http/pprof on this address")
	fs.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	cleanup := fs.Bool("cleanup", false, "remove the rules, holds and routes a stopped espd left, print them and exit")
	restoreHolds := fs.Bool("restore-holds", false, "put back the holds recorded in --state-dir and exit (at boot, before the network)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if udpPort == 0 || udpPort > 65535 {
		return fmt.Errorf("--udp-port %d out of range 1-65535", udpPort)
	}
	kio.EncapPort = uint16(udpPort)
	if ikePort == 0 || ikePort > 65535 || ikePort == udpPort {
		return fmt.Errorf("--ike-port %d: out of range 1-65535 or the --udp-port", ikePort)
	}
	opts.IKEPort = uint16(ikePort)
	if mark > 0xffffffff {
		return fmt.Errorf("--mark %d out of range", mark)
	}
	kio.Mark = uint32(mark)
	if *cleanup {
		return runCleanup(opts, os.Stdout)
	}
	if *restoreHolds {
		return runRestoreHolds(opts, os.Stdout)
	}
	if opts.StateDir == "" {
		// Without the durable record espd could not know, after a restart,
		// what a key added again has already sent: it refuses to run
		// rather than risk repeating a nonce (docs/safety.md).
		return errors.New("--state-dir is empty: espd needs a directory on persistent storage to record how far each outbound key's sequence numbers have gone; without it a key added again after a restart would repeat (key, sequence number) pairs")
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return fmt.Errorf("--log-level: %v", err)
	}
	hopts := &slog.HandlerOptions{Level: level}
	switch logFormat {
	case "text":
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, hopts))
	case "json":
		opts.Logger = slog.New(slog.NewJSONHandler(os.Stderr, hopts))
	default:
		return fmt.Errorf("--log-format %q: want text or json", logFormat)
	}

	if procs < 0 {
		return fmt.Errorf("--procs %d: negative", procs)
	}
	setProcs(procs, dp)
	if pprofAddr != "" {
		if err := startPprof(pprofAddr, opts.Logger); err != nil {
			return err
		}
	}
	opts.Notify = systemdNotifier(opts.Logger)
	d, err := daemon.New(opts)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	reload := make(chan struct{}, 1)
	go func() {
		for range hup {
			select {
			case reload <- struct{}{}:
			default:
			}
		}
	}()
	start := time.Now()
	err = d.Run(ctx, reload)
	opts.Logger.Info("stopped", "uptime", time.Since(start).Round(time.Second).String(), "err", err)
	return err
}
