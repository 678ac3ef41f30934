package tun_test

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/espd/espd/testbed"
	"github.com/espd/espd/tun"
)

// TestSetMTU: SetMTU changes the MTU in place: the same interface (index),
// its route still there, the kernel and MTU agreeing on the new value; an
// MTU out of range is refused, and a closed device says so.
func TestSetMTU(t *testing.T) {
	ns := testbed.NewNodeT(t, "tunmtu")
	const name = "espmtu"
	dev := createIn(t, ns, tun.Config{Name: name, MTU: 1400, Persist: true})
	defer ns.Do(func() error { return tun.Delete(name) })
	ns.MustIP(t, "route", "add", "198.18.78.0/24", "dev", name)
	index := dev.Index()
	if err := dev.SetMTU(1380); err != nil {
		t.Fatal(err)
	}
	if dev.MTU() != 1380 {
		t.Errorf("MTU() %d after SetMTU(1380)", dev.MTU())
	}
	out := ns.MustIP(t, "-o", "link", "show", name)
	if !strings.Contains(out, "mtu 1380 ") || !strings.HasPrefix(out, strconv.Itoa(index)+": ") {
		t.Errorf("after SetMTU(1380), want index %d and mtu 1380: %s", index, out)
	}
	if r := ns.MustIP(t, "route", "show", "198.18.78.0/24"); !strings.Contains(r, "dev "+name) {
		t.Errorf("the route went with SetMTU: %q", r)
	}
	for _, bad := range []int{0, 575, 65536} {
		if err := dev.SetMTU(bad); err == nil {
			t.Errorf("SetMTU(%d) accepted", bad)
		}
	}
	if dev.MTU() != 1380 {
		t.Errorf("MTU() %d after refused changes, want 1380", dev.MTU())
	}
	dev.Close()
	if err := dev.SetMTU(1300); err != os.ErrClosed {
		t.Errorf("SetMTU after Close: %v, want os.ErrClosed", err)
	}
}
