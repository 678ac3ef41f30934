package routing_test

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/routing"
)

// reboot empties what the kernel forgets at a reboot: espd's table and
// its rules, the mark rules too. The TUN stays (newEnv's tun0 stands in
// for the next espd's).
func (e *env) reboot(t *testing.T) {
	t.Helper()
	tbl := strconv.Itoa(table)
	for _, fam := range []string{"-4", "-6"} {
		e.ns.MustIP(t, fam, "route", "flush", "table", tbl)
		for _, pref := range []int{routing.DefaultPriority - 1, routing.DefaultPriority, routing.DefaultPriority + 1} {
			for {
				if _, err := e.ns.IP(t.Context(), fam, "rule", "del", "pref", strconv.Itoa(pref)); err != nil {
					break
				}
			}
		}
	}
}

// waitHoldFile waits until the hold file lists exactly want (sources as
// "from PREFIX", then the held prefixes).
func waitHoldFile(t *testing.T, path string, want ...string) {
	t.Helper()
	body := "espd holds 2\n" + strings.Join(append(want, "end "+strconv.Itoa(len(want))), "\n") + "\n"
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(path)
		if string(b) == body {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("hold file %s:\n%s\nwant:\n%s", path, b, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHoldFileSurvivesReboot: the held prefixes are recorded, put back by
// RestoreHolds after the kernel forgot them (the rules too), held by New,
// claimed by the policy installed again, and forgotten when its owner
// removes it.
func TestHoldFileSurvivesReboot(t *testing.T) {
	e := newEnv(t)
	e.defaultRoutes(t)
	path := filepath.Join(t.TempDir(), "holds")
	cfg := routing.Config{HoldFile: path}
	r := e.router(t, cfg)
	mustAdd(t, r, "198.18.70.0/24", routing.Tunnel)
	mustAdd(t, r, "2001:db8:70::/48", routing.Tunnel)
	mustAdd(t, r, "198.18.71.0/24", routing.Throw) // a bypass is not held
	waitHoldFile(t, path, "from 0.0.0.0/0", "from ::/0", "198.18.70.0/24", "2001:db8:70::/48")
	mustRemove(t, r, "2001:db8:70::/48", routing.Tunnel)
	waitHoldFile(t, path, "from 0.0.0.0/0", "198.18.70.0/24")
	mustAdd(t, r, "2001:db8:70::/48", routing.Tunnel)
	r.Close()
	waitHoldFile(t, path, "from 0.0.0.0/0", "from ::/0", "198.18.70.0/24", "2001:db8:70::/48")

	e.reboot(t)
	e.expect(t, "rebooted", map[string]string{"198.18.70.9": "out0", "2001:db8:70::9": "out0"})
	var done []string
	err := e.ns.Do(func() (err error) {
		done, err = routing.RestoreHolds(routing.Config{Table: table, HoldFile: path})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != 4 { // two holds, two rules
		t.Errorf("RestoreHolds did %q, want two routes and two rules", done)
	}
	e.expect(t, "restored", map[string]string{"198.18.70.9": "blackhole", "2001:db8:70::9": "blackhole", "198.18.71.9": "out0"})

	// The next espd: New holds what the file lists even when the table
	// lost it in between.
	e.reboot(t)
	r2 := e.router(t, cfg)
	if n := r2.Adopted(); n != 2 {
		t.Errorf("Adopted() = %d, want 2", n)
	}
	e.expect(t, "espd up", map[string]string{"198.18.70.9": "blackhole", "2001:db8:70::9": "blackhole"})
	mustAdd(t, r2, "198.18.70.0/24", routing.Tunnel)
	e.expect(t, "policy back", map[string]string{"198.18.70.9": "tun0"})
	mustRemove(t, r2, "198.18.70.0/24", routing.Tunnel)
	// The recorded IPv4 source keeps its rule while the IPv6 hold is
	// unclaimed (it might be what closes that hold's traffic).
	waitHoldFile(t, path, "from 0.0.0.0/0", "from ::/0", "2001:db8:70::/48")
	e.expect(t, "policy removed", map[string]string{"198.18.70.9": "out0", "2001:db8:70::9": "blackhole"})
}

// TestHoldReleasedByPolicy: a hold the file brought back that no policy
// claims is opened by installing a policy for the prefix and removing it
// (espctl policy add, then del), and the file forgets it.
func TestHoldReleasedByPolicy(t *testing.T) {
	e := newEnv(t)
	e.defaultRoutes(t)
	path := filepath.Join(t.TempDir(), "holds")
	if err := os.WriteFile(path, []byte("espd holds 1\n198.18.70.0/24\n198.18.72.0/24\nend 2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := e.router(t, routing.Config{HoldFile: path})
	e.expect(t, "restored", map[string]string{"198.18.70.9": "blackhole", "198.18.72.9": "blackhole"})
	mustAdd(t, r, "198.18.70.0/24", routing.Tunnel)
	mustRemove(t, r, "198.18.70.0/24", routing.Tunnel)
	e.expect(t, "released", map[string]string{"198.18.70.9": "out0", "198.18.72.9": "blackhole"})
	// Format 1 meant the /0 source of each family it held prefixes of.
	waitHoldFile(t, path, "from 0.0.0.0/0", "198.18.72.0/24")
	if n := e.ruleCount(t, "-6"); n != 0 {
		t.Errorf("%d IPv6 rules for a format 1 file with IPv4 prefixes only", n)
	}
}

// TestHoldFileDamaged: a hold file that cannot be trusted is refused by
// New, naming the file, which changes nothing; RestoreHolds (the boot)
// does not open what it may have held: it holds everything, every
// unmarked packet to any destination, and says so with ErrHoldFile.
func TestHoldFileDamaged(t *testing.T) {
	e := newEnv(t)
	for name, body := range map[string]string{
		"cut":        "espd holds 1\n198.18.70.0/24\n",
		"count":      "espd holds 1\n198.18.70.0/24\nend 2\n",
		"header":     "espd holds 9\nend 0\n",
		"not prefix": "espd holds 1\n198.18.70.1/24\nend 1\n",
		"after end":  "espd holds 1\nend 0\n198.18.70.0/24\n",
		"empty":      "",
		"v1 source":  "espd holds 1\nfrom 198.18.1.0/24\n198.18.70.0/24\nend 2\n",
		"v2 source":  "espd holds 2\nfrom 198.18.1.1/24\n198.18.70.0/24\nend 2\n",
		"v2 count":   "espd holds 2\nfrom 198.18.1.0/24\n198.18.70.0/24\nend 1\n",
		"v2 cut":     "espd holds 2\nfrom 198.18.1.0/24\n",
		"v2 word":    "espd holds 2\nto 198.18.1.0/24\nend 1\n",
	} {
		path := filepath.Join(t.TempDir(), "holds")
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := routing.Config{LinkIndex: e.index, LinkName: "tun0", Table: table, HoldFile: path}
		err := e.ns.Do(func() error {
			r, err := routing.New(cfg)
			if err == nil {
				r.Close()
			}
			return err
		})
		if !errors.Is(err, routing.ErrHoldFile) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: New: %v, want ErrHoldFile naming the file", name, err)
		}
		if out := e.ns.MustIP(t, "route", "show", "table", "all", "proto", "229"); strings.TrimSpace(out) != "" {
			t.Errorf("%s: routes after New refused the file:\n%s", name, out)
		}
		if out := e.ns.MustIP(t, "rule", "show"); strings.Contains(out, strconv.Itoa(routing.DefaultPriority)+":") {
			t.Errorf("%s: rules after New refused the file:\n%s", name, out)
		}
		var done []string
		err = e.ns.Do(func() (err error) { done, err = routing.RestoreHolds(cfg); return err })
		if !errors.Is(err, routing.ErrHoldFile) || !strings.Contains(err.Error(), "holding every destination") {
			t.Errorf("%s: RestoreHolds: %v, want ErrHoldFile saying it holds everything", name, err)
		}
		t.Logf("%s: RestoreHolds added %q", name, done)
		for _, dst := range []string{"198.18.70.1", "198.19.1.1", "2001:db8:70::1"} {
			if got := e.dev(t, dst, 0); got != "blackhole" {
				t.Errorf("%s: after RestoreHolds an unmarked packet to %s goes %s, want blackhole", name, dst, got)
			}
			if got := e.dev(t, dst, routing.DefaultMark); got == "blackhole" {
				t.Errorf("%s: espd's own (marked) packets to %s are held too", name, dst)
			}
		}
		if err := e.ns.Do(func() error { _, err := routing.Cleanup(routing.Config{Table: table}); return err }); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCleanupRemovesHoldFile: taking espd out for good forgets the holds
// at the next boot too.
func TestCleanupRemovesHoldFile(t *testing.T) {
	e := newEnv(t)
	path := filepath.Join(t.TempDir(), "holds")
	r := e.router(t, routing.Config{HoldFile: path})
	mustAdd(t, r, "198.18.70.0/24", routing.Tunnel)
	r.Close()
	waitHoldFile(t, path, "from 0.0.0.0/0", "198.18.70.0/24")
	var done []string
	err := e.ns.Do(func() (err error) {
		done, err = routing.Cleanup(routing.Config{Table: table, HoldFile: path})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("hold file left after Cleanup: %v", err)
	}
	if !strings.Contains(strings.Join(done, "\n"), "file "+path) {
		t.Errorf("Cleanup did not say it removed the hold file: %q", done)
	}
}

// TestHoldFileUnwritableAtStart: New records what is held before it
// returns; a hold file it cannot write is New's error (the service fails
// visibly), naming the file.
func TestHoldFileUnwritableAtStart(t *testing.T) {
	e := newEnv(t)
	path := filepath.Join(t.TempDir(), "holds")
	if err := os.Mkdir(path+".new", 0o700); err != nil {
		t.Fatal(err)
	}
	cfg := routing.Config{LinkIndex: e.index, LinkName: "tun0", Table: table, HoldFile: path}
	err := e.ns.Do(func() error {
		r, err := routing.New(cfg)
		if err == nil {
			r.Close()
		}
		return err
	})
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Errorf("New with an unwritable hold file: %v, want an error naming it", err)
	}
}
