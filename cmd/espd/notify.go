package main

import (
	"log/slog"
	"sync"

	sd "github.com/coreos/go-systemd/v22/daemon"
)

// systemdNotifier returns the daemon's Notify function (daemon.Options):
// it sends each state to the service manager's socket in NOTIFY_SOCKET
// (sd_notify(3); systemd sets it for a Type=notify unit) and does nothing
// where the variable is unset. A failed send is logged, the first one as a
// warning and the later ones at debug level: the service manager decides
// what a missing READY=1 means.
func systemdNotifier(log *slog.Logger) func(state string) {
	var once sync.Once
	return func(state string) {
		if _, err := sd.SdNotify(false, state); err != nil {
			warned := true
			once.Do(func() {
				warned = false
				log.Warn("cannot notify the service manager (NOTIFY_SOCKET)", "state", state, "err", err)
			})
			if warned {
				log.Debug("cannot notify the service manager (NOTIFY_SOCKET)", "state", state, "err", err)
			}
		}
	}
}
