// Package daemon is espd itself: it ties the SA and policy databases, the
// data plane, the control socket, the configuration file and the metrics
// endpoint together, and implements the control socket's Backend. cmd/espd
// is a thin main around it.
package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/espd/espd/control"
	"github.com/espd/espd/crypto"
	"github.com/espd/espd/dataplane"
	"github.com/espd/espd/gwpair"
	"github.com/espd/espd/ikehub"
	"github.com/espd/espd/pairsync"
	"github.com/espd/espd/sa"

	"golang.org/x/sys/unix"
)

// DefaultStateDir is espd's --state-dir unless told otherwise (the
// systemd units' StateDirectory).
const DefaultStateDir = "/var/lib/espd"

// HoldFile is the record of the held prefixes in a state directory
// (routing.Config.HoldFile): espd --restore-holds puts them back at boot.
func HoldFile(stateDir string) string { return filepath.Join(stateDir, "holds") }

// Options configure a Daemon.
type Options struct {
	// Dataplane configures the pipeline: workers, batches, queues, MTUs.
	Dataplane dataplane.Config
	// IO configures the TUN device, the policy routing and the outer
	// sockets espd creates for the data plane (kernelio.go).
	IO IOConfig
	// Control configures the control socket.
	Control control.ServerConfig
	// ConfigPath is the configuration file of static SAs and policies
	// (docs/config.md); empty means none.
	ConfigPath string
	// StateDir is the directory of the durable record of how far each
	// outbound key's sequence numbers may have gone (package seqstore), so
	// that a restart never repeats a (key, sequence number) pair; empty
	// keeps it in memory, which protects keys for the life of the process
	// only (library tests).
	StateDir string
	// MetricsListen is the address of the Prometheus endpoint (/metrics);
	// empty means none.
	MetricsListen string
	// MetricsPerSA exports per-state series (espd_sa_*) for at most this
	// many states, the oldest first; 0, the default, exports only totals
	// over all states (package metrics).
	MetricsPerSA int
	// Logger receives the daemon's logs; nil discards them.
	Logger *slog.Logger
	// IKEHandoff makes espd own the IKE port (IKEPort, 0: 500) next to the
	// encapsulation port and hand IKE datagrams to the IKE daemon
	// registered on the control socket (package ikehub).
	IKEHandoff bool
	IKEPort    uint16
	// Notify, if set, is told the daemon's state changes as sd_notify(3)
	// state strings, for a service manager (cmd/espd sends them to
	// systemd): NotifyReady once espd can take states (the data plane and
	// its TUN up, the IKE ports bound with IKEHandoff, the configuration
	// file applied, the control socket and the metrics endpoint
	// listening), NotifyReloading and then NotifyReady around each reload,
	// NotifyStopping when the shutdown begins. It is called from Run's
	// goroutine, which waits for it.
	Notify func(state string)
	// Pair makes espd one node of an active/standby gateway pair
	// (package gwpair, docs/ha.md); it starts standing by.
	Pair PairOptions
}

// PairOptions make espd one node of a gateway pair (gwpair.Options).
type PairOptions = gwpair.Options

// The state strings Options.Notify receives (sd_notify(3)).
const (
	// NotifyReady: espd takes states and policies; after a reload: the
	// reload is over (applied or refused).
	NotifyReady = "READY=1"
	// NotifyStopping: the shutdown has begun.
	NotifyStopping = "STOPPING=1"
	// NotifyReloading starts the reloading message, which goes on with
	// the monotonic clock's time (MONOTONIC_USEC=, as systemd asks).
	NotifyReloading = "RELOADING=1"
)

// Daemon is a running espd.
type Daemon struct {
	opts Options
	log  *slog.Logger
	db   *sa.DB
	dp   *dataplane.Device
	ctl  *control.Server

	closeSeq     func() error // closes the sequence-number store
	kio          *kernelIO    // the TUN, router and sockets, while Run runs
	policyRoutes policyRoutes // the policies' routes through kio.router
	routes       policyRouter // &policyRoutes (tests inject failures)

	// mu serializes changes of states and policies that also touch routes
	// or the file's bookkeeping (control requests and reloads).
	mu     sync.Mutex
	file   fileState
	ifaces map[uint32]*ifaceDev // route-based interfaces by ID (interfaces.go)
	// warnedIfIDs are the interface IDs without an interface that
	// warnNoInterface has logged.
	warnedIfIDs map[uint32]bool
	slow        slowSuites // the AES suites warnSlowAES has logged (cpu.go)

	ike atomic.Pointer[ikehub.Hub] // the IKE hand-off, while it runs (ike.go)

	pair *gwpair.Pair // the gateway pair's part, with Options.Pair

	writes stateWrites // failed writes of the state directory's records
}

// New prepares a daemon; Run starts it.
func New(opts Options) (*Daemon, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	seq, closeSeq, err := openSeqStore(opts.StateDir, log)
	if err != nil {
		return nil, err
	}
	if opts.StateDir != "" && opts.IO.HoldFile == "" {
		opts.IO.HoldFile = HoldFile(opts.StateDir)
	}
	opts.IO.setDefaults()
	dbOpts := sa.Options{Seq: seq, SeqError: seqErrorLogger(log)}
	var pr *gwpair.Pair
	if opts.Pair.Node != 0 {
		opts.Pair.Mark = opts.IO.Mark
		if pr, err = gwpair.New(opts.Pair, seq, log); err != nil {
			closeSeq()
			return nil, err
		}
		dbOpts.Seq, dbOpts.PairNode, dbOpts.LocalSeq = pr.Node(), opts.Pair.Node, pr.Store()
		if local := opts.Pair.LocalAddrs; len(local) > 0 {
			dbOpts.PairLocal = func(a netip.Addr) bool { return slices.Contains(local, a.Unmap()) }
		}
	}
	db := sa.NewDB(dbOpts)
	if pr != nil {
		pr.SetDB(db)
		db.SetStandby(true) // until told otherwise (PAIR_ROLE)
	}
	dp, err := dataplane.New(opts.Dataplane, db, log.With("component", "dataplane"))
	if err != nil {
		if pr != nil {
			pr.Node().Close()
		}
		closeSeq()
		return nil, err
	}
	d := &Daemon{opts: opts, log: log, db: db, dp: dp, closeSeq: closeSeq, ifaces: map[uint32]*ifaceDev{}, pair: pr}
	d.opts.IO.holdFileError = func(err error) { d.stateWriteFailed(stateFileHolds, err) }
	d.policyRoutes.noIPv6 = opts.IO.NoIPv6
	d.policyRoutes.log = log.With("component", "routing")
	d.routes = &d.policyRoutes
	d.file = fileState{sas: map[saKey]fileSA{}, policies: map[policyKey]sa.Policy{}}
	return d, nil
}

// Run starts the data plane, loads the configuration file, serves the
// control socket (and metrics) and runs until ctx is done or reload
// returns; then it shuts down: control socket closed, every state deleted
// (keys zeroed), the TUN and its routes removed, the holds of installed
// policies kept (shutdown). reload delivers SIGHUP. Options.Notify hears
// when it is ready, reloading and stopping.
func (d *Daemon) Run(ctx context.Context, reload <-chan struct{}) (err error) {
	if err := d.startDataplane(); err != nil {
		return fmt.Errorf("data plane: %w", err)
	}
	defer func() { err = errors.Join(err, d.shutdown()) }()
	d.log.Info("data plane up", "tun", d.opts.IO.TUN.Name, "workers", d.dp.Config().Workers,
		"encap_port", d.opts.IO.EncapPort, "table", d.opts.IO.Table)
	if !crypto.SecretErasure {
		d.log.Warn("built without GOEXPERIMENT=runtimesecret: key schedules, stack frames and freed memory that held a deleted SA's keys are not erased (docs/safety.md, Keys)")
	}
	if err := d.startIKE(); err != nil {
		return fmt.Errorf("IKE hand-off: %w", err)
	}
	defer d.stopIKE()

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		// Stop the goroutines before shutdown tears down what they use.
		cancel()
		if d.ctl != nil {
			err = errors.Join(err, d.ctl.Close())
		}
		wg.Wait()
	}()
	wg.Add(1)
	go func() { defer wg.Done(); d.db.Run(ctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); d.logEvents(ctx) }()
	if d.pair != nil {
		wg.Add(1)
		go func() { defer wg.Done(); d.pair.Node().Run(ctx) }()
		wg.Add(1)
		go func() {
			defer wg.Done()
			d.pair.RetryRelease(ctx, cmp.Or(d.opts.Pair.Interval, pairsync.DefaultInterval))
		}()
		d.log.Info("gateway pair: standing by until told the role", "node", d.pair.Num(), "listen", d.opts.Pair.Listen, "peer", d.opts.Pair.Peer)
	}
	if d.kio.xdp != nil {
		wg.Add(1)
		go func() { defer wg.Done(); syncXDP(ctx, d.db, d.kio.xdp, d.log.With("component", "dataplane")) }()
	}

	recorded := d.recordedInterfaces()
	if d.opts.ConfigPath != "" {
		if err := d.Reload(); err != nil {
			return fmt.Errorf("configuration: %w", err)
		}
		states, policies := d.fileCounts()
		d.log.Info("configuration loaded", "path", d.opts.ConfigPath, "states", states, "policies", policies)
	}
	d.dropStaleInterfaces(recorded)
	if d.pair != nil {
		d.pair.ApplyRoleFile(ctx, d.opts.Pair.RoleFile, d.opts.Pair.Lease)
	}

	ccfg := d.opts.Control
	if ccfg.Logf == nil {
		clog := d.log.With("component", "control")
		ccfg.Logf = func(format string, args ...any) { clog.Warn(fmt.Sprintf(format, args...)) }
	}
	ctl, err := control.Listen(d, ccfg)
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	d.ctl = ctl
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := ctl.Serve(); err != nil {
			d.log.Error("control socket stopped", "err", err)
		}
	}()
	d.log.Info("control socket listening", "path", ctl.Path())

	if d.opts.MetricsListen != "" {
		srv, err := d.serveMetrics()
		if err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		defer srv.Close()
	}

	d.notify(NotifyReady)
	for {
		select {
		case <-ctx.Done():
			d.notify(NotifyStopping)
			d.log.Info("stopping")
			return nil
		case <-reload:
			d.notify(reloadingMessage())
			var rerr *recordError
			if err := d.Reload(); errors.As(err, &rerr) {
				d.log.Error("configuration reloaded; the record for the next boot is not written", "err", err)
			} else if err != nil {
				d.log.Error("configuration refused; running state unchanged", "err", err)
			} else {
				states, policies := d.fileCounts()
				d.log.Info("configuration reloaded", "path", d.opts.ConfigPath, "states", states, "policies", policies)
			}
			d.notify(NotifyReady)
		}
	}
}

// notify tells Options.Notify, if set, state.
func (d *Daemon) notify(state string) {
	if d.opts.Notify != nil {
		d.opts.Notify(state)
	}
}

// reloadingMessage is NotifyReloading with the monotonic clock's time, in
// microseconds, which systemd uses to tell this reload from an earlier one.
func reloadingMessage() string {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return NotifyReloading
	}
	return fmt.Sprintf("%s\nMONOTONIC_USEC=%d", NotifyReloading, ts.Nano()/1000)
}

// fileCounts returns how many states and policies the configuration file
// installed.
func (d *Daemon) fileCounts() (states, policies int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.file.sas), len(d.file.policies)
}

// startDataplane creates the TUN, the router and the sockets and starts
// the data plane on them.
func (d *Daemon) startDataplane() error {
	k, err := openIO(&d.opts.IO, d.dp.Config().Batch, d.log.With("component", "dataplane"))
	if err != nil {
		return err
	}
	if err := d.dp.Start(k.dataplaneIO()); err != nil {
		k.close()
		return err
	}
	d.kio = k
	d.policyRoutes.setRouter(k.router)
	return nil
}

// shutdown deletes every state (zeroing its keys) and policy, closes the
// router (the routes into the TUN go) and then the data plane, which
// closes the TUN device and the sockets. The
// policies go from the database only, not through RemovePolicyRoute: a
// shutdown is not their owners removing them, so the holds of the protect
// and drop policies (and the bypasses' throw routes and the rules) stay and
// keep their traffic from leaving in clear until espd is back (routing's
// package doc; espd --cleanup removes them for good).
func (d *Daemon) shutdown() error {
	var errs []error
	d.mu.Lock()
	d.db.FlushPolicies()
	d.db.FlushSAs()
	d.mu.Unlock()
	errs = append(errs, d.closeSeq()) // after FlushSAs retired the keys
	if d.kio != nil {
		d.policyRoutes.setRouter(nil)
		errs = append(errs, d.kio.closeRouter())
	}
	errs = append(errs, d.dp.Close())
	return errors.Join(errs...)
}

// logEvents logs expire and acquire events.
func (d *Daemon) logEvents(ctx context.Context) {
	sub := d.db.Subscribe(256)
	defer sub.Close()
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-sub.Events():
			if !ok {
				return
			}
			d.log.Info("event", "event", ev.String())
		}
	}
}
