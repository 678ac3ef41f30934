package daemon

import "github.com/espd/espd/sa"

// Test-only API: what the tests use and espd does not.

// DB returns the daemon's SA and policy databases.
func (d *Daemon) DB() *sa.DB { return d.db }
