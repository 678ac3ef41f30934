package crypto

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/cpu"
)

// noAVX2Env names the environment variable that marks the child run of
// TestWithoutAESNIAndAVX2.
const noAVX2Env = "ESPD_CRYPTO_NO_AVX2_CHILD"

// noAVX2GODEBUG turns off what boxes without AES-NI lack (the harness's
// -noaesni mode uses the same switches): Go's AES-GCM then runs its generic
// code, and ChaCha20-Poly1305 espd's own SSSE3 assembly
// (crypto/internal/chachapoly; TestChildChaChaSSSE3 checks the choice).
const noAVX2GODEBUG = "cpu.aes=off,cpu.pclmulqdq=off,cpu.avx2=off"

// TestWithoutAESNIAndAVX2 runs the known-answer, scapy and round-trip
// tests again in a child process with AES-NI, PCLMULQDQ and AVX2 switched
// off, so that the code paths a Celeron or Atom gateway runs are checked
// against the same vectors as the AVX2 and AES-NI ones.
func TestWithoutAESNIAndAVX2(t *testing.T) {
	if os.Getenv(noAVX2Env) != "" {
		t.Skip("this is the child run")
	}
	if testing.Short() {
		t.Skip("-short: no child run")
	}
	tests := []string{"TestChildCPUFeaturesOff", "TestChildChaChaSSSE3", "TestDraftMcGrewGCM", "TestRFC7634ESPExample", "TestRFC3602Cases",
		"TestScapyVectors", "TestRoundTrip", "TestESNHighBits", "TestTamper", "TestMalformed"}
	cmd := exec.Command(os.Args[0], "-test.count=1", "-test.v",
		"-test.run=^("+strings.Join(tests, "|")+")$")
	cmd.Env = append(os.Environ(), noAVX2Env+"=1", "GODEBUG="+noAVX2GODEBUG)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("tests with GODEBUG=%s: %v\n%s", noAVX2GODEBUG, err, out)
	}
	for _, name := range tests {
		if !strings.Contains(string(out), "--- PASS: "+name+" ") {
			t.Errorf("%s did not pass in the child run with GODEBUG=%s:\n%s", name, noAVX2GODEBUG, out)
		}
	}
}

// TestChildCPUFeaturesOff, in the child run of TestWithoutAESNIAndAVX2,
// checks that the GODEBUG switches took: x/crypto picks its ChaCha20-Poly1305
// assembly from golang.org/x/sys/cpu, so with AVX2 still on there the child
// would test the AVX2 path again instead of the SSSE3 one.
func TestChildCPUFeaturesOff(t *testing.T) {
	if os.Getenv(noAVX2Env) == "" {
		t.Skip("only in the child run of TestWithoutAESNIAndAVX2")
	}
	if cpu.X86.HasAES || cpu.X86.HasPCLMULQDQ || cpu.X86.HasAVX2 {
		t.Fatalf("GODEBUG=%s: x/sys/cpu still reports AES %v, PCLMULQDQ %v, AVX2 %v",
			noAVX2GODEBUG, cpu.X86.HasAES, cpu.X86.HasPCLMULQDQ, cpu.X86.HasAVX2)
	}
}
