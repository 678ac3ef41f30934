package testbed

import (
	"bytes"
	"crypto/rand"
	"os"
	"runtime"
	"testing"
	"unsafe"
)

// TestScanRange finds a needle wherever it sits, across read boundaries
// too, exactly once.
func TestScanRange(t *testing.T) {
	needle := []byte("0123456789abcdef")
	for at := 0; at+len(needle) <= 100; at++ {
		mem := bytes.Repeat([]byte{'.'}, 100)
		copy(mem[at:], needle)
		buf := make([]byte, 20+len(needle))
		hits := dedupeHits(scanRange(nil, bytes.NewReader(mem), 0, 100, buf, len(needle), map[string][]byte{"n": needle}, "test"))
		if len(hits) != 1 || hits[0].Addr != uint64(at) {
			t.Errorf("needle at %d: hits %v", at, hits)
		}
	}
}

// TestScanMemory finds a needle planted in this process's heap at its
// address, and a random needle only where the test itself holds it.
func TestScanMemory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("reading /proc/self/mem of a scan needs root here (CI is root)")
	}
	needle := make([]byte, 32)
	rand.Read(needle)
	planted := make([]byte, 4096)
	copy(planted[1000:], needle)
	hits, err := ScanMemory(os.Getpid(), map[string][]byte{"needle": needle})
	if err != nil {
		t.Fatal(err)
	}
	want := uint64(uintptr(unsafe.Pointer(&planted[1000])))
	found := false
	for _, h := range hits {
		found = found || h.Addr == want
	}
	if !found {
		t.Errorf("the planted needle at 0x%x was not found; hits %v", want, hits)
	}
	runtime.KeepAlive(planted)
}
