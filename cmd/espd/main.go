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
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/espd/espd/conn"
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
		udpPort   uint
		mark      uint
		logFormat string
		logLevel  string
		ikePort   uint
		pprofAddr string
		procs     int
	)
	fs.StringVar(&dp.TUN.Name, "tun", tun.DefaultName, "name of the cleartext TUN device")
	fs.IntVar(&dp.TUN.MTU, "mtu", tun.DefaultMTU, "MTU of the TUN device")
	fs.BoolVar(&dp.TUN.NoURing, "tun-no-uring", false, "write the TUN with one writev(2) per packet or super-packet, not through io_uring (one io_uring_enter per batch)")
	fs.IntVar(&dp.TUN.TxQueueLen, "tun-txqueuelen", tun.DefaultTxQueueLen, "length of the TUN's transmit queue, the packets routed into it that espd has not read yet; a full queue drops (espd_dataplane_tun_queue_drops_total), a long one adds delay under load")
	fs.IntVar(&dp.OuterMTU, "outer-mtu", 0, "MTU of the path to the peers (0: the route's MTU)")
	fs.IntVar(&dp.Workers, "workers", runtime.GOMAXPROCS(0), "crypto worker goroutines, default one per CPU: batches are encrypted and decrypted in parallel and leave in order, as with pcrypt (0: none, each reader runs its own batches to completion, which saves two goroutine handoffs per batch where system calls and not crypto are the limit)")
	fs.IntVar(&dp.HandOffBelow, "hand-off-below", dataplane.DefaultHandOffBelow, "with workers, a crypto rate in MB/s: while a direction's crypto runs slower than this (measured on its batches), its readers hand the batches off to the workers; while faster, they run them to completion, which saves two goroutine handoffs per batch (0: always hand off)")
	fs.IntVar(&procs, "procs", 0, "GOMAXPROCS (0: the GOMAXPROCS environment variable if set, else half the CPUs while the readers run batches to completion (--workers 0, or workers with --hand-off-below while the crypto is fast) and all of them while batches are handed off to the workers)")
	fs.UintVar(&udpPort, "udp-port", uint(conn.DefaultEncapPort), "ESP-in-UDP port (RFC 3948)")
	fs.UintVar(&mark, "mark", 0, "SO_MARK of espd's outer packets, kept out of the TUN by a policy-routing rule (0: default)")
	fs.IntVar(&dp.Table, "table", 0, "routing table of the routes into the TUN (0: default)")
	fs.IntVar(&dp.RecvBuffer, "recv-buffer", dataplane.DefaultRecvBuffer, "forced SO_RCVBUF of the outer sockets in bytes (negative: kernel default)")
	fs.BoolVar(&dp.NoIPv6, "no-ipv6", false, "open no IPv6 sockets and install no IPv6 rule")
	fs.DurationVar(&dp.Keepalive, "keepalive", dataplane.DefaultKeepalive, "NAT keepalive interval for UDP-encapsulated SAs (negative: off)")
	fs.StringVar(&opts.Control.Path, "socket", control.DefaultSocketPath, "control socket path")
	fs.StringVar(&opts.Control.Group, "socket-group", "", "group (name or gid) whose members may use the control socket besides root")
	fs.StringVar(&opts.ConfigPath, "config", "", "configuration file of static SAs and policies, re-read on SIGHUP")
	fs.StringVar(&opts.StateDir, "state-dir", daemon.DefaultStateDir, "directory (created 0700, one espd at a time) of the durable record of how far each outbound key's sequence numbers may have gone, by key fingerprint (never keys), so that a restart or a crash never repeats a (key, sequence number) pair; on persistent storage, never empty")
	fs.StringVar(&opts.MetricsListen, "metrics-listen", "", "address of the Prometheus /metrics endpoint (e.g. 127.0.0.1:9585)")
	fs.Func("metrics-per-sa", "also export per-state series (espd_sa_*) for at most `N` states, the oldest first (default 0: only totals over all states, a few KB whatever the number of states). Each state adds 2 series plus one per drop reason it has seen, about 100 bytes each: 100,000 states make a ~20 MB scrape and 200,000 series in Prometheus", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("want a number of states, 0 or more")
		}
		opts.MetricsPerSA = n
		return nil
	})
	fs.BoolVar(&opts.IKEHandoff, "ike-handoff", false, "own the IKE port and the encapsulation port, and hand IKE to charon's espd plugin over the control socket")
	fs.UintVar(&ikePort, "ike-port", 500, "IKE port with --ike-handoff")
	fs.StringVar(&pprofAddr, "pprof-listen", "", "debugging: serve net/http/pprof (CPU, block, mutex profiles) on this address, e.g. 127.0.0.1:6060")
	fs.StringVar(&logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	cleanup := fs.Bool("cleanup", false, "remove what espd leaves in the kernel's routing when it is killed or stopped with policies installed (the rules, the blackhole routes holding protected prefixes closed, the bypasses' throw routes; see --table, --mark, --no-ipv6), print it and exit; refused while an espd runs with the same --socket, --tun or --table")
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
	dp.EncapPort = uint16(udpPort)
	if ikePort == 0 || ikePort > 65535 || ikePort == udpPort {
		return fmt.Errorf("--ike-port %d: out of range 1-65535 or the --udp-port", ikePort)
	}
	opts.IKEPort = uint16(ikePort)
	if mark > 0xffffffff {
		return fmt.Errorf("--mark %d out of range", mark)
	}
	dp.Mark = uint32(mark)
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
