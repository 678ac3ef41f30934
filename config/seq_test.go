package config

import (
	"bytes"
	"strings"
	"testing"
)

const seqKey = "0x000102030405060708090a0b0c0d0e0f10111213"

func seqSA(dir, suite, extra string) string {
	return "[[sa]]\nspi = 0x1001\ndir = \"" + dir + "\"\nsrc = \"198.18.0.1\"\ndst = \"198.18.0.2\"\nsuite = \"" + suite +
		"\"\nenc_key = \"" + seqKey + "\"\nreqid = 1\nreplay_window = 64\n" + extra
}

// TestParseSeq: oseq, replay_seq and replay_bitmap, as integers or
// strings, up to 2^64-1.
func TestParseSeq(t *testing.T) {
	for _, tc := range []struct {
		text      string
		oseq, top uint64
		bitmap    []byte
	}{
		{seqSA("out", "aes128gcm16-esn", "oseq = 4294967293\n"), 1<<32 - 3, 0, nil},
		{seqSA("out", "aes128gcm16-esn", "oseq = \"0xfffffffffffffffe\"\n"), 1<<64 - 2, 0, nil},
		{seqSA("out", "aes128gcm16", "oseq = \"4294967294\"\n"), 1<<32 - 2, 0, nil},
		{seqSA("in", "aes128gcm16-esn", "replay_seq = \"18446744073709551615\"\nreplay_bitmap = \"0x0500\"\n"), 0, 1<<64 - 1, []byte{5, 0}},
		{seqSA("in", "aes128gcm16", "replay_seq = 100\n"), 0, 100, nil},
	} {
		f, err := Parse("gw.toml", []byte(tc.text))
		if err != nil {
			t.Fatalf("%s: %v", tc.text, err)
		}
		c := f.SAs[0]
		if c.OSeq != tc.oseq || c.ReplaySeq != tc.top || !bytes.Equal(c.ReplayBitmap, tc.bitmap) {
			t.Errorf("%s: oseq %d replay-seq %d bitmap %x", tc.text, c.OSeq, c.ReplaySeq, c.ReplayBitmap)
		}
		f.Wipe()
	}
}

// TestParseSeqErrors: the file gets sa's messages (the same rules as the
// control socket and espctl), after the key's name and the SA's line.
func TestParseSeqErrors(t *testing.T) {
	for _, tc := range []struct{ text, want string }{
		{seqSA("in", "aes128gcm16", "oseq = 5\n"), "oseq: state spi 0x00001001: oseq is the outbound sequence number; an inbound state takes replay-seq"},
		{seqSA("out", "aes128gcm16", "replay_seq = 5\n"), "replay_seq: state spi 0x00001001: replay-seq is inbound replay state"},
		{seqSA("out", "aes128gcm16", "oseq = 4294967295\n"), "oseq: state spi 0x00001001: oseq 4294967295 leaves no sequence number to send"},
		{seqSA("out", "aes128gcm16-esn", "oseq = \"18446744073709551615\"\n"), "leaves no sequence number to send"},
		{seqSA("in", "aes128gcm16", "replay_seq = 4294967296\n"), "replay-seq 4294967296 is above 2^32-1"},
		{seqSA("in", "aes128gcm16", "replay_bitmap = \"01\"\n"), "replay_bitmap: state spi 0x00001001: replay-bitmap needs replay-seq"},
		{seqSA("in", "aes128gcm16", "replay_seq = 1000\nreplay_bitmap = \"000000000000000000\"\n"), "replay-bitmap of 9 bytes is longer than the replay window of 64 packets (8 bytes)"},
		{seqSA("in", "aes128gcm16", "replay_seq = 2\nreplay_bitmap = \"04\"\n"), "replay-bitmap bit 2 stands for number 2-2, below 1"},
		{seqSA("in", "aes128gcm16", "replay_seq = 2\nreplay_bitmap = \"0x4\"\n"), "replay_bitmap \"0x4\": want hex bytes"},
		{seqSA("out", "aes128gcm16", "oseq = -1\n"), "oseq: -1 is negative"},
		{seqSA("out", "aes128gcm16", "oseq = \"lots\"\n"), "oseq: value \"lots\": want a sequence number"},
		{seqSA("out", "aes128gcm16", "oseq = 1.5\n"), "oseq: want an integer or a string"},
	} {
		_, err := Parse("gw.toml", []byte(tc.text))
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "gw.toml:1: sa #1: ") {
			t.Errorf("%s: %v, want %q", tc.text, err, tc.want)
		}
	}
}
