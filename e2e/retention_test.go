package e2e

import (
	"context"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/espd/espd/seqstore"
	"github.com/espd/espd/testbed"
)

// advanceRunClock appends to the state directory's log the record espd
// writes at a clean stop to say how long it ran (seqstore's record.go:
// kind 4, the run clock in seconds at bytes 16-23, CRC-32C of bytes 0-59
// at 60-63), saying that espd ran d longer than the log's newest record.
// It stands for an espd that ran d more, as the store's only clock is the
// one its records carry. espd must be stopped (it holds the directory).
func advanceRunClock(t *testing.T, dir string, d time.Duration) {
	t.Helper()
	path := filepath.Join(dir, seqstore.LogName)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const rec = 64
	if len(b) < 2*rec || len(b)%rec != 0 {
		t.Fatalf("%s holds %d bytes, want a header and records of %d bytes", path, len(b), rec)
	}
	var clock uint64
	for off := 0; off < len(b); off += rec {
		clock = max(clock, binary.BigEndian.Uint64(b[off+16:]))
	}
	var r [rec]byte
	r[0] = 4 // clock
	binary.BigEndian.PutUint64(r[16:], clock+uint64(d/time.Second))
	binary.BigEndian.PutUint32(r[60:], crc32.Checksum(r[:60], crc32.MakeTable(crc32.Castagnoli)))
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(r[:]); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestSeqRetentionManual: a manually keyed outbound state (espctl) sends,
// is deleted, and stays out for longer than the store's retention of
// running time (seqstore.DefaultRetain, with espd restarted in between, as
// after a long maintenance); added again with the same SPI and key, it
// continues right after the last number it sent, never at 1.
func TestSeqRetentionManual(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st := newSeqTunnel(t)
	capt := startSeqCapture(t, st.top)
	transfer(t, ctx, st.top, testbed.IPv4, true, smallTransfer)
	last := st.quietSeqOut(t)
	// The tunnel is taken out: the state is deleted, then espd stops.
	st.a.e.mustCtl(t, saGetArgs("del", spiAB, st.bOuter)...)
	st.a.term()
	// More than the retention of running time passes with the state out.
	advanceRunClock(t, st.a.state, seqstore.DefaultRetain+24*time.Hour)
	mark(t, st.top)
	a := st.a.start()
	keyAllSeq(t, a, st.aSAs, st.aPolicies)
	if n := st.seqOut(t, a); n != last {
		t.Errorf("the manual key, added again %v of running time after its deletion, starts with seq-out %d, want %d (the last it sent)", seqstore.DefaultRetain+24*time.Hour, n, last)
	}
	ping(t, ctx, st.top, testbed.IPv4, false)
	runs := stopSeqCapture(t, capt)
	if len(runs) != 2 || len(runs[0]) == 0 || len(runs[1]) == 0 {
		t.Fatalf("runs in the capture: %v packets, want 2 runs that sent", runLens(runs))
	}
	if want := runs[0][len(runs[0])-1] + 1; runs[1][0] != want {
		t.Errorf("after the retention the key started at sequence number %d, want %d", runs[1][0], want)
	}
}
