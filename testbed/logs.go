package testbed

import (
	"context"
	"log/slog"
	"sync"
)

// Logs is a slog.Handler that keeps every record, for tests that count
// log lines. It is safe for concurrent use.
type Logs struct {
	mu   sync.Mutex
	recs []slog.Record
}

// Logger returns a logger that writes to l at every level.
func (l *Logs) Logger() *slog.Logger { return slog.New(l) }

// Enabled implements slog.Handler.
func (l *Logs) Enabled(context.Context, slog.Level) bool { return true }

// WithAttrs implements slog.Handler; the attributes are dropped.
func (l *Logs) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup implements slog.Handler; the group is dropped.
func (l *Logs) WithGroup(string) slog.Handler { return l }

// Handle implements slog.Handler.
func (l *Logs) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.recs = append(l.recs, r.Clone())
	l.mu.Unlock()
	return nil
}

// Records returns the records whose message is msg, oldest first.
func (l *Logs) Records(msg string) []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []slog.Record
	for _, r := range l.recs {
		if r.Message == msg {
			out = append(out, r)
		}
	}
	return out
}

// Attr returns the value of r's attribute key, if it has one.
func Attr(r slog.Record, key string) (slog.Value, bool) {
	var v slog.Value
	found := false
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v, found = a.Value, true
		}
		return !found
	})
	return v, found
}

// All returns every record, oldest first.
func (l *Logs) All() []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]slog.Record(nil), l.recs...)
}
