package testbed

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// MemoryHit is one place in a process's memory where a needle was found.
type MemoryHit struct {
	Needle  string // the needle's name
	Addr    uint64 // where it starts
	Mapping string // the mapping's line in /proc/PID/maps
}

// String names the needle, the address and the mapping.
func (h MemoryHit) String() string {
	return fmt.Sprintf("%s at 0x%x in %s", h.Needle, h.Addr, h.Mapping)
}

// memScanChunk is how much of a mapping ScanMemory reads at a time.
const memScanChunk = 1 << 20

// ScanMemory searches every readable mapping of process pid (heap, stacks,
// anonymous memory, the binary's data; not [vvar] and [vsyscall], which
// cannot be read) for each needle, by name, and returns every place one
// occurs. It reads /proc/PID/mem, so it needs the rights of ptrace (root).
// The process keeps running: a scan is a snapshot taken over a few
// milliseconds, enough for memory that no longer changes.
func ScanMemory(pid int, needles map[string][]byte) ([]MemoryHit, error) {
	longest := 0
	for name, n := range needles {
		if len(n) < 8 {
			return nil, fmt.Errorf("needle %s: %d bytes is too short to mean anything", name, len(n))
		}
		longest = max(longest, len(n))
	}
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return nil, err
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return nil, err
	}
	defer mem.Close()
	var hits []MemoryHit
	sc := bufio.NewScanner(bytes.NewReader(maps))
	buf := make([]byte, memScanChunk+longest)
	for sc.Scan() {
		line := sc.Text()
		lo, hi, perms, ok := parseMapsLine(line)
		if !ok || perms[0] != 'r' || strings.HasSuffix(line, "[vvar]") || strings.HasSuffix(line, "[vsyscall]") || strings.HasSuffix(line, "[vvar_vclock]") {
			continue
		}
		hits = scanRange(hits, mem, lo, hi, buf, longest, needles, line)
	}
	return dedupeHits(hits), sc.Err()
}

// scanRange appends to hits every needle found in r between lo and hi,
// reading len(buf) bytes at a time, each read overlapping the last by
// longest-1 bytes so that no needle straddling two reads is missed. A
// range that cannot be read (a guard page) ends the scan of the range.
func scanRange(hits []MemoryHit, r io.ReaderAt, lo, hi uint64, buf []byte, longest int, needles map[string][]byte, mapping string) []MemoryHit {
	for at := lo; at < hi; {
		n := int(min(uint64(len(buf)), hi-at))
		k, err := r.ReadAt(buf[:n], int64(at))
		if k == 0 && err != nil {
			return hits
		}
		for name, nd := range needles {
			for off := 0; ; {
				i := bytes.Index(buf[off:k], nd)
				if i < 0 {
					break
				}
				hits = append(hits, MemoryHit{Needle: name, Addr: at + uint64(off+i), Mapping: mapping})
				off += i + 1
			}
		}
		if at+uint64(k) >= hi || k < longest {
			return hits
		}
		at += uint64(k - longest + 1)
	}
	return hits
}

// dedupeHits drops the second sighting of a needle at one address (the
// chunks overlap).
func dedupeHits(hits []MemoryHit) []MemoryHit {
	seen := make(map[MemoryHit]bool, len(hits))
	out := hits[:0]
	for _, h := range hits {
		if !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	return out
}

// parseMapsLine returns the address range and permissions of a line of
// /proc/PID/maps ("lo-hi perms offset dev inode path").
func parseMapsLine(line string) (lo, hi uint64, perms string, ok bool) {
	f := strings.Fields(line)
	if len(f) < 2 {
		return 0, 0, "", false
	}
	a, b, found := strings.Cut(f[0], "-")
	if !found || len(f[1]) < 4 {
		return 0, 0, "", false
	}
	lo, err1 := strconv.ParseUint(a, 16, 64)
	hi, err2 := strconv.ParseUint(b, 16, 64)
	if err1 != nil || err2 != nil || hi <= lo {
		return 0, 0, "", false
	}
	return lo, hi, f[1], true
}
