package chachapoly

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/cpu"
)

// childEnv marks the child run of TestWithoutAVX2.
const childEnv = "ESPD_CHACHAPOLY_NO_AVX2_CHILD"

// TestWithoutAVX2 runs this package's tests again in a child process with
// GODEBUG=cpu.avx2=off, the way a CPU without AVX2 sees them: there
// Preferred must be true, so package crypto would pick this code.
func TestWithoutAVX2(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("this is the child run")
	}
	if testing.Short() {
		t.Skip("-short: no child run")
	}
	if !Available {
		t.Skip("no SSSE3 implementation in this build or on this CPU: nothing to select")
	}
	tests := []string{"TestChildPreferred", "TestRFC8439BlockFunction", "TestRFC8439Encryption",
		"TestRFC8439AEAD", "TestDifferential", "TestShortAndBad", "FuzzAEAD"}
	cmd := exec.Command(os.Args[0], "-test.count=1", "-test.v", "-test.run=^("+strings.Join(tests, "|")+")$")
	cmd.Env = append(os.Environ(), childEnv+"=1", "GODEBUG=cpu.avx2=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("tests with GODEBUG=cpu.avx2=off: %v\n%s", err, out)
	}
	for _, name := range tests {
		if !strings.Contains(string(out), "--- PASS: "+name+" ") {
			t.Errorf("%s did not pass in the child run with GODEBUG=cpu.avx2=off:\n%s", name, out)
		}
	}
}

// TestChildPreferred, in the child run, checks that AVX2 is masked and
// that this package is then the one to use.
func TestChildPreferred(t *testing.T) {
	if os.Getenv(childEnv) == "" {
		t.Skip("only in the child run of TestWithoutAVX2")
	}
	if cpu.X86.HasAVX2 || !Available || !Preferred {
		t.Fatalf("GODEBUG=cpu.avx2=off: AVX2 %v, Available %v, Preferred %v; want false, true, true",
			cpu.X86.HasAVX2, Available, Preferred)
	}
}
