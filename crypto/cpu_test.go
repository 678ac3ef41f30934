package crypto

import (
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
)

func TestUsesAES(t *testing.T) {
	for name, want := range map[string]bool{
		"aes128gcm16": true, "aes256gcm12": true, "aes128gmac": true, "aes256-sha256": true,
		"aes128-sha1-esn": true, "chacha20poly1305": false, "null-sha256": false,
	} {
		s, err := ParseSuite(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := s.UsesAES(); got != want {
			t.Errorf("%s: UsesAES = %v, want %v", name, got, want)
		}
	}
}

// TestAESAcceleratedMasked runs this test binary again with the AES
// instructions masked by GODEBUG, as an administrator can to see what a
// CPU without them does: AESAccelerated must then say no.
func TestAESAcceleratedMasked(t *testing.T) {
	if os.Getenv("ESPD_TEST_AES_MASKED") == "1" {
		if AESAccelerated() {
			t.Fatal("AESAccelerated is true with GODEBUG=cpu.aes=off")
		}
		return
	}
	if runtime.GOARCH != "amd64" {
		t.Skip("GODEBUG masks x86's AES instructions only")
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestAESAcceleratedMasked$", "-test.v")
	cmd.Env = append(os.Environ(), "ESPD_TEST_AES_MASKED=1", "GODEBUG=cpu.aes=off")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS") {
		t.Fatalf("with GODEBUG=cpu.aes=off: %v\n%s", err, out)
	}
}

// TestAESAcceleratedAgreesWithKernel compares AESAccelerated with the
// flags the kernel lists for the CPU.
func TestAESAcceleratedAgreesWithKernel(t *testing.T) {
	if runtime.GOARCH != "amd64" || strings.Contains(os.Getenv("GODEBUG"), "cpu.") {
		t.Skip("reads x86 flags from /proc/cpuinfo, unmasked")
	}
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Skip(err)
	}
	var aes, clmul bool
	for _, l := range strings.Split(string(b), "\n") {
		if name, flags, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(name) == "flags" {
			for _, f := range strings.Fields(flags) {
				aes, clmul = aes || f == "aes", clmul || f == "pclmulqdq"
			}
			break
		}
	}
	if got := AESAccelerated(); got != (aes && clmul) {
		t.Errorf("AESAccelerated = %v; /proc/cpuinfo: aes %v, pclmulqdq %v", got, aes, clmul)
	}
}
