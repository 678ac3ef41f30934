package ikehub

import "time"

// When the IKE daemon's registration for the hand-off ends and no new one
// comes, espd says so in its own journal: charon's journal alone does not
// say why the gateway stopped passing traffic when charon cannot start
// again (the plugin package was removed by an upgrade of strongSwan, or
// charon cannot load the plugin), and espd's fail-closed policies then drop
// every policy's traffic without a word. The warning comes ikeAbsentFirst
// after the registration ended, then every ikeAbsentEvery while none is
// back; a new registration says how long the hand-off had none.
var (
	ikeAbsentFirst = 30 * time.Second
	ikeAbsentEvery = 10 * time.Minute
)

// The warning and its actionable part.
const (
	ikeAbsentMsg    = "no IKE daemon: charon's espd plugin is gone; IKE goes unanswered and charon's policies drop their traffic"
	ikeAbsentAdvice = "journalctl -u strongswan; strongswan-espd must match the installed strongSwan (docs/upgrade.md)"
)

// absence tracks the time without a registration. Its fields are guarded
// by Hub.mu.
type absence struct {
	since   time.Time   // when the last registration ended; zero while one runs
	timer   *time.Timer // the next warning
	stopped bool        // the hand-off stopped: no more warnings
}

// ended starts the watch when the current registration ended. h.mu is held.
func (h *Hub) ended(now time.Time) {
	if h.absent.stopped {
		return
	}
	h.absent.since = now
	h.armAbsent(ikeAbsentFirst)
}

// armAbsent schedules the next warning. h.mu is held.
func (h *Hub) armAbsent(d time.Duration) {
	if h.absent.timer != nil {
		h.absent.timer.Stop()
	}
	since := h.absent.since
	h.absent.timer = time.AfterFunc(d, func() { h.warnAbsent(since) })
}

// warnAbsent logs the warning if the registration that ended at since is
// still the last one, and schedules the next.
func (h *Hub) warnAbsent(since time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.absent.stopped || h.cur != nil || !h.absent.since.Equal(since) {
		return
	}
	h.log.Warn(ikeAbsentMsg, "for", time.Since(since).Round(time.Second), "advice", ikeAbsentAdvice)
	h.armAbsent(ikeAbsentEvery)
}

// back ends the watch when a registration comes. h.mu is held.
func (h *Hub) back() {
	if h.absent.timer != nil {
		h.absent.timer.Stop()
		h.absent.timer = nil
	}
	if !h.absent.since.IsZero() {
		h.log.Info("IKE daemon back after a time without one", "for", time.Since(h.absent.since).Round(time.Millisecond))
		h.absent.since = time.Time{}
	}
}

// stopAbsent ends the watch for good (the hand-off stops).
func (h *Hub) stopAbsent() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.absent.stopped = true
	if h.absent.timer != nil {
		h.absent.timer.Stop()
	}
}
