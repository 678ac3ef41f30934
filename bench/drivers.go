package main

import (
	"github.com/espd/espd/bench/report"
	"github.com/espd/espd/bench/system"
)

// recordDriver notes in the report which kernel crypto driver a system's
// states use for a suite (key), once it is keyed: what /proc/crypto said
// (system.KernelDriver), so that a run shows which driver it measured.
func recordDriver(info *report.System, s system.System, key string) {
	kd, ok := s.(system.KernelDriver)
	if !ok || kd.Driver() == "" {
		return
	}
	if info.Drivers == nil {
		info.Drivers = map[string]string{}
	}
	info.Drivers[key] = kd.Driver()
}
