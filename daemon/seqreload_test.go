package daemon

import (
	"net/netip"
	"os"
	"strings"
	"testing"
)

// TestReloadSeq: the configuration file sets oseq and replay state; a
// reload with a higher oseq raises the counter, a lower one changes
// nothing, and a new replay state is merged into the live window; a
// replacement (suite change under the same key) keeps the floor.
func TestReloadSeq(t *testing.T) {
	out := func(extra string) string {
		return reloadSA("0x1001", "out", gwLocal, gwPeer, "aes128gcm16-esn", keyOut, 1, extra)
	}
	in := func(extra string) string {
		return reloadSA("0x2001", "in", gwPeer, gwLocal, "aes128gcm16-esn", keyIn, 1, "replay_window = 64\n"+extra)
	}
	r := start(t, out("oseq = 4294967293\n")+in("replay_seq = 4294967396\nreplay_bitmap = \"0x05\"\n"))
	db := r.d.DB()
	s, ok := db.GetSA(0x1001, netip.MustParseAddr(gwPeer))
	if !ok {
		t.Fatal("not loaded")
	}
	if f, g := s.ReserveSeq(5); f != 1<<32-2 || g != 5 {
		t.Fatalf("first numbers %#x (%d), want from 2^32-2", f, g)
	}
	i, _ := db.GetSA(0x2001, netip.MustParseAddr(gwLocal))
	rw := i.Decapsulator().Replay
	if rw.Top() != 1<<32+100 || rw.Check(1<<32+99) != nil || rw.Check(1<<32+98) == nil {
		t.Fatalf("replay state not set: top %#x", rw.Top())
	}

	// The same file again: nothing changes (the floor is below the
	// counter now).
	r.reloadWith(t, out("oseq = 4294967293\n")+in("replay_seq = 4294967396\nreplay_bitmap = \"0x05\"\n"))
	if f, _ := s.ReserveSeq(1); f != 1<<32+3 {
		t.Fatalf("after an unchanged reload: %#x", f)
	}
	// A lower oseq: ignored; a higher one: raised, in place.
	r.reloadWith(t, out("oseq = 10\n")+in(""))
	if f, _ := s.ReserveSeq(1); f != 1<<32+4 {
		t.Fatalf("after a lower oseq: %#x", f)
	}
	r.reloadWith(t, out("oseq = 8589934592\n")+in("replay_seq = 4294967397\n"))
	if n, _ := db.GetSA(0x1001, netip.MustParseAddr(gwPeer)); n != s {
		t.Fatal("the state was replaced, not updated")
	}
	if f, _ := s.ReserveSeq(1); f != 1<<33+1 {
		t.Fatalf("after a higher oseq: %#x, want 2^33+1", f)
	}
	// The window is the union: a replay_seq without a bitmap refuses
	// everything up to it, 2^32+99 included now.
	if rw.Top() != 1<<32+101 || rw.Check(1<<32+99) == nil || rw.Check(1<<32+102) != nil {
		t.Fatalf("replay state not merged: top %#x", rw.Top())
	}
	// A file whose sequence settings are refused (a bitmap without
	// replay_seq; the other state's oseq raised in the same file) leaves
	// everything as it was: the counter and the window unmoved.
	top := rw.Top()
	if err := os.WriteFile(r.cfg, []byte(out("oseq = 17179869184\n")+in("replay_bitmap = \"0x01\"\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.d.Reload(); err == nil || !strings.Contains(err.Error(), "replay") {
		t.Fatalf("reload with a bitmap and no replay_seq: %v", err)
	}
	if f, _ := s.ReserveSeq(1); f != 1<<33+2 {
		t.Fatalf("a refused reload moved the counter: %#x, want 2^33+2", f)
	}
	if rw.Top() != top {
		t.Fatalf("a refused reload moved the window: top %#x, want %#x", rw.Top(), top)
	}
	// A suite change replaces the state under the same key: it continues
	// above the old one's counter even with a lower oseq.
	r.reloadWith(t, reloadSA("0x1001", "out", gwLocal, gwPeer, "aes128gcm16-esn", keyOut, 2, "oseq = 100\n")+in(""))
	n := db.OutboundSA(2)
	if n == nil || n == s {
		t.Fatal("not replaced")
	}
	if f, _ := n.ReserveSeq(1); f != 1<<33+3 {
		t.Fatalf("replacement starts at %#x, want 2^33+3", f)
	}
}
