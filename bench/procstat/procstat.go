// Package procstat reads CPU time from /proc for the benchmark harness's
// cost figures: per process (utime + stime of every thread) and for the
// whole machine (the first line of /proc/stat).
//
// On a kernel with tick-based CPU accounting and no IRQ time accounting
// (CONFIG_TICK_CPU_ACCOUNTING without CONFIG_IRQ_TIME_ACCOUNTING, the usual
// distribution kernel), softirq work is charged both to the task that was
// running when it ran (its stime) and to the machine's softirq column. A
// gateway process's figure therefore includes the packet forwarding that ran
// in its system calls, and kernel-only data paths show in the machine's
// softirq time.
package procstat

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// UserHZ is the unit of the tick counts in /proc (sysconf(_SC_CLK_TCK),
// fixed at 100 on Linux).
const UserHZ = 100

func ticks(n uint64) time.Duration {
	return time.Duration(n) * (time.Second / UserHZ)
}

// ProcessCPU returns the user and system CPU time of every thread of the
// process pid, alive or exited, from /proc/<pid>/stat.
func ProcessCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, fmt.Errorf("procstat: %w", err)
	}
	return parseStat(b)
}

// parseStat reads utime and stime (fields 14 and 15) from a
// /proc/<pid>/stat line. The command name (field 2) may hold spaces and
// parentheses, so the fields are counted from the last ')'.
func parseStat(b []byte) (time.Duration, error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, errors.New("procstat: stat line without a command name")
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("procstat: stat line with %d fields after the name", len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("procstat: utime/stime: %w", err)
	}
	return ticks(ut + st), nil
}

// Host is the machine's CPU time summed over all CPUs since boot.
type Host struct {
	User, Nice, System, Idle, IOWait, IRQ, Softirq, Steal time.Duration
}

// Busy is the time the CPUs spent on anything but idling or waiting: user,
// nice, system, irq and softirq (steal, taken by the hypervisor, excluded).
func (h Host) Busy() time.Duration {
	return h.User + h.Nice + h.System + h.IRQ + h.Softirq
}

// Sub returns h - o field by field.
func (h Host) Sub(o Host) Host {
	return Host{
		User: h.User - o.User, Nice: h.Nice - o.Nice, System: h.System - o.System,
		Idle: h.Idle - o.Idle, IOWait: h.IOWait - o.IOWait, IRQ: h.IRQ - o.IRQ,
		Softirq: h.Softirq - o.Softirq, Steal: h.Steal - o.Steal,
	}
}

// ReadHost reads the first ("cpu") line of /proc/stat.
func ReadHost() (Host, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return Host{}, fmt.Errorf("procstat: %w", err)
	}
	return parseHost(b)
}

func parseHost(b []byte) (Host, error) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return Host{}, fmt.Errorf("procstat: unexpected /proc/stat first line %q", line)
	}
	var v [8]uint64
	for i := range v {
		n, err := strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return Host{}, fmt.Errorf("procstat: /proc/stat field %d: %w", i+1, err)
		}
		v[i] = n
	}
	return Host{User: ticks(v[0]), Nice: ticks(v[1]), System: ticks(v[2]), Idle: ticks(v[3]),
		IOWait: ticks(v[4]), IRQ: ticks(v[5]), Softirq: ticks(v[6]), Steal: ticks(v[7])}, nil
}

// KernelThreads returns the pids of the kernel threads whose name starts
// with prefix (for example "ksoftirqd/").
func KernelThreads(prefix string) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("procstat: %w", err)
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil {
			continue
		}
		if strings.HasPrefix(string(comm), prefix) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// SumCPU returns the CPU time of the processes in pids; processes that
// have exited count zero.
func SumCPU(pids []int) time.Duration {
	var sum time.Duration
	for _, pid := range pids {
		if d, err := ProcessCPU(pid); err == nil {
			sum += d
		}
	}
	return sum
}
