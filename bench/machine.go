package main

import (
	"bufio"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"

	"github.com/espd/espd/bench/report"
	"golang.org/x/sys/unix"
)

// cryptoFlags are the CPU features that decide how fast Go's crypto runs.
var cryptoFlags = []string{"aes", "pclmulqdq", "avx2", "vaes", "vpclmulqdq", "avx512f", "sha_ni"}

// describeMachine reads the CPU model, core count, kernel and Go version.
func describeMachine() report.Machine {
	m := report.Machine{Cores: runtime.NumCPU(), Go: runtime.Version()}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				continue
			}
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			switch {
			case k == "model name" && m.CPU == "":
				m.CPU = v
			case k == "flags" && m.CPUFlags == nil:
				have := strings.Fields(v)
				m.CPUFlags = []string{}
				for _, fl := range cryptoFlags {
					if slices.Contains(have, fl) {
						m.CPUFlags = append(m.CPUFlags, fl)
					}
				}
			}
		}
	}
	if out, err := exec.Command("lscpu").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			k, v, _ := strings.Cut(line, ":")
			switch strings.TrimSpace(k) {
			case "Model name":
				m.CPU = strings.TrimSpace(v)
			case "Hypervisor vendor":
				m.Hypervisor = strings.TrimSpace(v)
			}
		}
	}
	return m
}
