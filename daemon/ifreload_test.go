package daemon

import (
	"context"
	"errors"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/statefile"
	"github.com/espd/espd/tun"
)

// rbConf is a configuration of route-based interfaces: rb1 with mtu (0:
// none given), and extra appended.
func rbConf(name string, mtu int, extra string) string {
	s := "[[interface]]\nname = \"" + name + "\"\nif_id = 1\n"
	if mtu != 0 {
		s += "mtu = " + strconv.Itoa(mtu) + "\n"
	}
	return s + extra
}

// TestReloadInterfaceInPlace: a reload that changes an [[interface]]'s
// mtu changes it on the same device (same index, the route into it
// kept, the data plane's device reporting the new MTU) and records it; a
// rename is refused with a message saying how, and so is an MTU the data
// plane cannot carry; a refused reload undoes an MTU change; a record that
// cannot be written is the reload's error, logged and counted, with the
// change applied.
func TestReloadInterfaceInPlace(t *testing.T) {
	state := t.TempDir()
	r := startWith(t, rbConf("rb1", 0, ""), state)
	link := func() string {
		t.Helper()
		return r.ns.MustIP(t, "-o", "link", "show", "rb1")
	}
	index := strings.SplitN(link(), ":", 2)[0]
	r.ns.MustIP(t, "route", "add", "198.18.66.0/24", "dev", "rb1")
	same := func(when string, mtu int) {
		t.Helper()
		l := link()
		if !strings.HasPrefix(l, index+":") || !strings.Contains(l, " mtu "+strconv.Itoa(mtu)+" ") {
			t.Errorf("%s: %s; want index %s, mtu %d", when, l, index, mtu)
		}
		if rt := r.ns.MustIP(t, "route", "show", "198.18.66.0/24"); !strings.Contains(rt, "dev rb1") {
			t.Errorf("%s: the route into rb1 is gone: %q", when, rt)
		}
		r.d.mu.Lock()
		got := r.d.ifaces[1].dev.MTU()
		r.d.mu.Unlock()
		if got != mtu {
			t.Errorf("%s: the data plane's device says MTU %d, want %d", when, got, mtu)
		}
	}
	same("start", 1400)

	r.reloadWith(t, rbConf("rb1", 1380, ""))
	same("mtu 1380", 1380)
	if specs, err := ReadInterfaces(InterfacesFile(state)); err != nil || len(specs) != 1 || specs[0].MTU != 1380 {
		t.Errorf("record after the MTU change: %v %v", specs, err)
	}

	refused := func(conf, want string) {
		t.Helper()
		if err := os.WriteFile(r.cfg, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		err := r.d.Reload()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("reload %q: %v, want an error saying %q", conf, err, want)
		}
	}
	refused(rbConf("rb9", 1380, ""), "remove the [[interface]] in one reload and add it in another")
	same("rename refused", 1380)
	if _, err := r.ns.IP(context.Background(), "link", "show", "rb9"); err == nil {
		t.Error("a refused rename created rb9")
	}
	refused(rbConf("rb1", 20000, ""), "above")
	same("mtu above the data plane's refused", 1380)
	// The MTU changes before "lo" (no TUN) fails: undone.
	refused(rbConf("rb1", 1300, "[[interface]]\nname = \"lo\"\nif_id = 9\n"), "interface lo (if_id 9)")
	same("refused reload with an MTU change", 1380)

	// A refused reload leaves an interface it attached to (made before,
	// as --restore-holds does at boot, with a route on it) in place.
	err := r.ns.Do(func() error {
		dev, err := tun.Create(tun.Config{Name: "rb5", Persist: true, NoURing: true})
		if err == nil {
			dev.Close()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	r.ns.MustIP(t, "route", "add", "198.18.65.0/24", "dev", "rb5")
	refused(rbConf("rb1", 1380, "[[interface]]\nname = \"rb5\"\nif_id = 5\n\n[[interface]]\nname = \"lo\"\nif_id = 9\n"), "interface lo (if_id 9)")
	if rt := r.ns.MustIP(t, "route", "show", "198.18.65.0/24"); !strings.Contains(rt, "dev rb5") {
		t.Errorf("a refused reload deleted rb5, which it had attached to: route %q", rt)
	}
	same("refused reload attaching rb5", 1380)

	// The record cannot be written: the reload says so, the change stays.
	if err := os.Mkdir(InterfacesFile(state)+".new", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(r.cfg, []byte(rbConf("rb1", 1360, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	err = r.d.Reload()
	var rerr *recordError
	if !errors.As(err, &rerr) {
		t.Errorf("reload with the record unwritable: %v, want a recordError", err)
	}
	same("record unwritable", 1360)
	if n := r.d.writes.failed[stateFileInterfaces].Load(); n == 0 {
		t.Error("the failed write of the record was not counted")
	}
	os.Remove(InterfacesFile(state) + ".new")
	r.reloadWith(t, rbConf("rb1", 1360, ""))
	// Nor the hold file: a policy that holds a prefix changes it.
	if err := os.Mkdir(HoldFile(state)+".new", 0o700); err != nil {
		t.Fatal(err)
	}
	r.reloadWith(t, rbConf("rb1", 1360, "\n"+reloadPolicy("198.18.67.0/24", 5)))
	if !pollFor(10*time.Second, func() bool { return r.d.writes.failed[stateFileHolds].Load() > 0 }) {
		t.Error("the failed write of the hold file was not counted")
	}
	rec := httptest.NewRecorder()
	r.d.metricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, file := range []string{"holds", "interfaces"} {
		name := `espd_state_write_errors_total{file="` + file + `"} `
		if i := strings.Index(rec.Body.String(), name); i < 0 || strings.HasPrefix(rec.Body.String()[i+len(name):], "0\n") {
			t.Errorf("the scrape has no %s above 0", name)
		}
	}
	if _, found, err := statefile.Read(filepath.Join(state, "interfaces")); err != nil || !found {
		t.Errorf("record after the directory was fixed: %v %v", found, err)
	}
}
