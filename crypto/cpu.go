package crypto

import (
	"runtime"

	"golang.org/x/sys/cpu"
)

// AESAccelerated reports whether the CPU has the instructions Go's AES
// and GCM use (AES rounds and carry-less multiplication). Without them Go
// falls back to table-based AES and GHASH: several times slower, and not
// constant-time. GODEBUG=cpu.aes=off or cpu.pclmulqdq=off masks them, as
// it does for Go's own crypto.
func AESAccelerated() bool {
	switch runtime.GOARCH {
	case "amd64", "386":
		return cpu.X86.HasAES && cpu.X86.HasPCLMULQDQ
	case "arm64":
		return cpu.ARM64.HasAES && cpu.ARM64.HasPMULL
	case "s390x":
		return cpu.S390X.HasAES && cpu.S390X.HasGHASH
	case "ppc64", "ppc64le":
		return cpu.PPC64.IsPOWER8
	}
	// 32-bit ARM and the rest: Go has no AES instructions there.
	return false
}

// UsesAES reports whether the suite's cipher is AES (CBC, CTR, CCM, GCM or
// GMAC), whose speed and timing depend on AESAccelerated.
func (s Suite) UsesAES() bool {
	switch s.Encryption {
	case EncrAESCBC, EncrAESCTR, EncrAESCCM8, EncrAESCCM12, EncrAESCCM16,
		EncrAESGCM8, EncrAESGCM12, EncrAESGCM16, EncrNullAuthAESGMAC:
		return true
	}
	return s.Integrity == AuthAESXCBC96
}
