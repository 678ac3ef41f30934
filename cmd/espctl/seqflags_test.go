package main

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"

	"github.com/espd/espd/control/wire"
)

// TestSeqFlags: --oseq, --replay-seq and --replay-bitmap become the
// fields of the request, in decimal or 0x hex, up to 2^64-1.
func TestSeqFlags(t *testing.T) {
	c, fields, err := parseSA(t, "sa update", false, []string{"config", "update"},
		"--spi", "0x10", "--dst", "198.18.0.2", "--oseq", "0xfffffffffffffffe")
	if err != nil || fields != wire.FieldOSeq || c.OSeq != 1<<64-2 {
		t.Fatalf("--oseq: %v fields %b oseq %d", err, fields, c.OSeq)
	}
	c, fields, err = parseSA(t, "sa update", false, []string{"config", "update"},
		"--spi", "0x10", "--dst", "198.18.0.2", "--replay-seq", "4294967396", "--replay-bitmap", "0x0500ff")
	if err != nil || fields != wire.FieldReplay || c.ReplaySeq != 1<<32+100 || !bytes.Equal(c.ReplayBitmap, []byte{5, 0, 0xff}) {
		t.Fatalf("--replay-seq: %v fields %b %d %x", err, fields, c.ReplaySeq, c.ReplayBitmap)
	}
	for _, tc := range []struct{ flag, value, want string }{
		{"--oseq", "18446744073709551616", "want a sequence number from 0 to 2^64-1"},
		{"--oseq", "-1", "want a sequence number"},
		{"--replay-seq", "ten", "want a sequence number"},
		{"--replay-bitmap", "0x123", "want hex bytes"},
		{"--replay-bitmap", "zz", "want hex bytes"},
		{"--replay-bitmap", "", "want hex bytes"},
	} {
		_, _, err := parseSA(t, "sa update", false, []string{"config", "update"}, "--spi", "0x10", "--dst", "198.18.0.2", tc.flag, tc.value)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("%s %q: %v, want %q", tc.flag, tc.value, err, tc.want)
		}
	}
}

// TestSeqThroughDaemon sets oseq and replay state with espctl against a
// real control server, reads them back in text and JSON, and gets the
// daemon's errors for values it refuses.
func TestSeqThroughDaemon(t *testing.T) {
	d := startDaemon(t)
	gcm := keyFile(t, gcmKey)
	d.espctl(t, 0, "sa", "add", "--spi", "0xc0000010", "--src", "198.18.0.1", "--dst", "198.18.0.2", "--dir", "out",
		"--enc", "aes128gcm16-esn", "--enc-key-file", gcm, "--oseq", "0xfffffffd")
	out, _ := d.espctl(t, 0, "sa", "get", "--spi", "0xc0000010", "--dst", "198.18.0.2")
	if !strings.Contains(out, "\tseq-out 4294967293\n") {
		t.Fatalf("sa get:\n%s", out)
	}
	s, _ := d.db.GetSA(0xc0000010, netip.MustParseAddr("198.18.0.2"))
	if f, g := s.ReserveSeq(5); f != 1<<32-2 || g != 5 {
		t.Fatalf("first numbers %#x (%d)", f, g)
	}
	d.espctl(t, 0, "sa", "update", "--spi", "0xc0000010", "--dst", "198.18.0.2", "--oseq", "100") // lower: ignored
	out, _ = d.espctl(t, 0, "--json", "sa", "get", "--spi", "0xc0000010", "--dst", "198.18.0.2")
	var got map[string]any
	if err := json.Unmarshal([]byte(out), &got); err != nil || got["stats"].(map[string]any)["seq_out"] != float64(1<<32+2) {
		t.Fatalf("json after crossing 2^32: %v %s", err, out)
	}

	key2 := keyFile(t, "0x1111111111111111111111111111111111111111")
	d.espctl(t, 0, "sa", "add", "--spi", "0xc0000011", "--src", "198.18.0.2", "--dst", "198.18.0.1", "--dir", "in",
		"--enc", "aes128gcm16-esn", "--enc-key-file", key2, "--replay-window", "64",
		"--replay-seq", "0x100000064", "--replay-bitmap", "0x05")
	out, _ = d.espctl(t, 0, "sa", "get", "--spi", "0xc0000011", "--dst", "198.18.0.1")
	if !strings.Contains(out, "\treplay-window 64 replay-top 4294967396\n") || !strings.Contains(out, "\treplay-bitmap 0x05ffffffffffffff\n") {
		t.Fatalf("sa get inbound:\n%s", out)
	}
	out, _ = d.espctl(t, 0, "--json", "sa", "list")
	var list []map[string]any
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatal(err)
	}
	st := list[1]["stats"].(map[string]any)
	if st["replay_top"] != float64(1<<32+100) || st["replay_bitmap"] != "0x05ffffffffffffff" || list[0]["stats"].(map[string]any)["replay_bitmap"] != "" {
		t.Fatalf("sa list --json: %s", out)
	}
	in, _ := d.db.GetSA(0xc0000011, netip.MustParseAddr("198.18.0.1"))
	rw := in.Decapsulator().Replay
	if rw.Check(1<<32+99) != nil || rw.Check(1<<32+98) == nil || rw.Check(1<<32+100) == nil {
		t.Fatal("the window does not refuse what the bitmap marks")
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sa", "update", "--spi", "0xc0000011", "--dst", "198.18.0.1", "--oseq", "5"}, "oseq is the outbound sequence number"},
		{[]string{"sa", "update", "--spi", "0xc0000010", "--dst", "198.18.0.2", "--replay-seq", "5"}, "replay-seq is inbound replay state"},
		{[]string{"sa", "update", "--spi", "0xc0000011", "--dst", "198.18.0.1", "--replay-seq", "5", "--replay-bitmap", "0x000000000000000001"}, "longer than the replay window of 64 packets"},
	} {
		_, stderr := d.espctl(t, 1, tc.args...)
		if !strings.Contains(stderr, tc.want) || !strings.Contains(stderr, "EINVAL") {
			t.Errorf("%q: %q, want %q", tc.args, stderr, tc.want)
		}
	}
}
