package afxdp

import (
	"os"
	"testing"
)

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (BPF and network namespaces); CI runs as root")
	}
}
