// Package packaging holds the tests of what packaging/ ships: the systemd
// units in packaging/systemd agree with espd's defaults, pass
// systemd-analyze verify, and start an espd that runs a tunnel when it is
// started as they start it (its user, its capabilities and nothing more,
// its flags, its directories, its readiness and reload protocol).
package packaging

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/coreos/go-systemd/v22/unit"

	"github.com/espd/espd/control"
	"github.com/espd/espd/daemon"
)

// The shipped units: espd.service without the IKE hand-off, espd-ike.service
// with it.
const (
	unitsDir    = "systemd"
	plainUnit   = "espd.service"
	handoffUnit = "espd-ike.service"
	// holdsUnit restores the holds at boot (espd --restore-holds).
	holdsUnit   = "espd-holds.service"
	handoffFlag = "--ike-handoff"
	sysusers    = "espd.sysusers"
)

// Where the Debian package installs what the units name.
const (
	espdPath   = "/usr/sbin/espd"
	configPath = "/etc/espd/espd.toml"
)

// unitFile is a parsed unit file.
type unitFile struct {
	name string
	opts []*unit.UnitOption
}

// loadUnit parses packaging/systemd/name with go-systemd's unit parser.
func loadUnit(t *testing.T, name string) *unitFile {
	t.Helper()
	f, err := os.Open(filepath.Join(unitsDir, name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	opts, err := unit.DeserializeOptions(f)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return &unitFile{name: name, opts: opts}
}

// values returns the values of section's setting name in file order, as
// systemd accumulates a list setting: an empty assignment resets it.
func (u *unitFile) values(section, name string) []string {
	var vs []string
	for _, o := range u.opts {
		if o.Section != section || o.Name != name {
			continue
		}
		if o.Value == "" {
			vs = nil
			continue
		}
		vs = append(vs, o.Value)
	}
	return vs
}

// value returns the one value of section's setting name and fails the test
// if there is not exactly one.
func (u *unitFile) value(t *testing.T, section, name string) string {
	t.Helper()
	vs := u.values(section, name)
	if len(vs) != 1 {
		t.Fatalf("%s: [%s] %s= is set %d times, want once: %q", u.name, section, name, len(vs), vs)
	}
	return vs[0]
}

// words splits the value of section's setting name at white space. It
// refuses what systemd would interpret (quotes, escapes, specifiers) other
// than the variables in allowed, so that the words are exactly what systemd
// passes on.
func (u *unitFile) words(t *testing.T, section, name string, allowed ...string) []string {
	t.Helper()
	v := u.value(t, section, name)
	w := strings.Fields(v)
	for _, word := range w {
		if slices.Contains(allowed, word) {
			continue
		}
		if strings.ContainsAny(word, `"'\%$;`) {
			t.Fatalf("%s: %s=%s: %q needs systemd's quoting or expansion rules, which this test does not apply", u.name, name, v, word)
		}
	}
	return w
}

// execStart returns ExecStart's command line.
func (u *unitFile) execStart(t *testing.T) []string {
	t.Helper()
	return u.words(t, "Service", "ExecStart")
}

// caps returns the unit's ambient capabilities (CAP_NET_ADMIN, ...),
// sorted, and fails the test unless its capability bounding set is the
// same: every capability espd may ever have, it has from the start, and
// none that it does not need.
func (u *unitFile) caps(t *testing.T) []string {
	t.Helper()
	set := func(name string) []string {
		var cs []string
		for _, v := range u.values("Service", name) {
			if strings.HasPrefix(v, "~") {
				t.Fatalf("%s: %s=%s: an inverted set is not what this test expects", u.name, name, v)
			}
			cs = append(cs, strings.Fields(v)...)
		}
		slices.Sort(cs)
		return slices.Compact(cs)
	}
	amb, bound := set("AmbientCapabilities"), set("CapabilityBoundingSet")
	if len(amb) == 0 || !slices.Equal(amb, bound) {
		t.Fatalf("%s: AmbientCapabilities %q and CapabilityBoundingSet %q must be the same, non-empty set", u.name, amb, bound)
	}
	return amb
}

// TestUnitsMatchEspd checks the units against espd itself: the binary,
// configuration, socket and state paths it uses, the readiness and reload
// protocol it implements, the flag that makes the two units differ, and
// the user the package creates.
func TestUnitsMatchEspd(t *testing.T) {
	wantCaps := map[string][]string{
		plainUnit:   {"CAP_NET_ADMIN", "CAP_NET_RAW"},
		handoffUnit: {"CAP_NET_ADMIN", "CAP_NET_BIND_SERVICE", "CAP_NET_RAW"},
	}
	users := sysusersUsers(t)
	for _, name := range []string{plainUnit, handoffUnit} {
		t.Run(name, func(t *testing.T) {
			u := loadUnit(t, name)
			if v := u.value(t, "Service", "Type"); v != "notify" {
				t.Errorf("Type=%s, want notify: espd tells systemd when it can take states", v)
			}
			argv := u.execStart(t)
			if argv[0] != espdPath {
				t.Errorf("ExecStart runs %s, want %s (where the package installs espd)", argv[0], espdPath)
			}
			if i := slices.Index(argv, "--config"); i < 0 || i+1 >= len(argv) || argv[i+1] != configPath {
				t.Errorf("ExecStart %q: want --config %s (ExecReload re-reads it)", argv, configPath)
			}
			if got, want := slices.Contains(argv, handoffFlag), name == handoffUnit; got != want {
				t.Errorf("ExecStart %q: %s present %v, want %v", argv, handoffFlag, got, want)
			}
			for _, a := range argv {
				if a == "--socket" || a == "--state-dir" || strings.HasPrefix(a, "--socket=") || strings.HasPrefix(a, "--state-dir=") {
					t.Errorf("ExecStart sets %s: the unit's RuntimeDirectory= and StateDirectory= hold espd's defaults, and the test below relies on that", a)
				}
			}
			// The control socket (espd's default --socket, where charon's
			// plugin and espctl look) is in the runtime directory systemd
			// makes for espd's user, the sequence-number record in its
			// state directory.
			if got, want := "/run/"+u.value(t, "Service", "RuntimeDirectory"), filepath.Dir(control.DefaultSocketPath); got != want {
				t.Errorf("RuntimeDirectory is %s, espd's default socket %s is in %s", got, control.DefaultSocketPath, want)
			}
			if got := "/var/lib/" + u.value(t, "Service", "StateDirectory"); got != daemon.DefaultStateDir {
				t.Errorf("StateDirectory is %s, espd's default --state-dir %s", got, daemon.DefaultStateDir)
			}
			if got := u.words(t, "Service", "ExecReload", "$MAINPID"); !slices.Equal(got, []string{"/bin/kill", "-HUP", "$MAINPID"}) {
				t.Errorf("ExecReload=%q, want /bin/kill -HUP $MAINPID (espd re-reads --config on SIGHUP)", got)
			}
			if got := u.caps(t); !slices.Equal(got, wantCaps[name]) {
				t.Errorf("capabilities %q, want %q (TestServiceAsUnit shows each one is needed)", got, wantCaps[name])
			}
			if user := u.value(t, "Service", "User"); !slices.Contains(users, user) {
				t.Errorf("User=%s, which %s (users %q) does not create", user, sysusers, users)
			}
			if v := u.value(t, "Service", "NoNewPrivileges"); v != "yes" {
				t.Errorf("NoNewPrivileges=%s", v)
			}
			if got := u.values("Unit", "Before"); !strings.Contains(strings.Join(got, " "), "strongswan.service") {
				t.Errorf("Before=%q: charon's plugin needs espd's control socket, so espd starts (and is ready) before strongswan.service", got)
			}
		})
	}
}

// TestUnitsDifferOnlyInHandoff requires the two units to be the same but for
// the hand-off: its flag, its capability, and their names for each other.
// A change to one unit's sandboxing that is not made to the other fails.
func TestUnitsDifferOnlyInHandoff(t *testing.T) {
	plain, handoff := loadUnit(t, plainUnit), loadUnit(t, handoffUnit)
	differ := map[string]bool{"Description": true, "Conflicts": true, "ExecStart": true, "AmbientCapabilities": true, "CapabilityBoundingSet": true}
	strip := func(u *unitFile) []string {
		var s []string
		for _, o := range u.opts {
			if !differ[o.Name] {
				s = append(s, "["+o.Section+"] "+o.Name+"="+o.Value)
			}
		}
		return s
	}
	if a, b := strip(plain), strip(handoff); !slices.Equal(a, b) {
		t.Errorf("%s and %s differ beyond the hand-off:\n%s\n%s", plainUnit, handoffUnit, strings.Join(a, "\n"), strings.Join(b, "\n"))
	}
	a, b := plain.execStart(t), handoff.execStart(t)
	if !slices.Equal(append(a, handoffFlag), b) {
		t.Errorf("ExecStart: %q and %q should differ only by %s at the end", a, b, handoffFlag)
	}
	if got, want := handoff.caps(t), append(plain.caps(t), "CAP_NET_BIND_SERVICE"); !slices.Equal(got, sorted(want)) {
		t.Errorf("%s capabilities %q, want %s's plus CAP_NET_BIND_SERVICE", handoffUnit, got, plainUnit)
	}
	if got := plain.values("Unit", "Conflicts"); !slices.Equal(got, []string{handoffUnit}) {
		t.Errorf("%s: Conflicts=%q, want %s", plainUnit, got, handoffUnit)
	}
	if got := handoff.values("Unit", "Conflicts"); !slices.Equal(got, []string{plainUnit}) {
		t.Errorf("%s: Conflicts=%q, want %s", handoffUnit, got, plainUnit)
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// sysusersUsers returns the users packaging/systemd/espd.sysusers creates
// (sysusers.d(5) lines of type u).
func sysusersUsers(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(unitsDir, sysusers))
	if err != nil {
		t.Fatal(err)
	}
	var users []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "u" {
			users = append(users, f[1])
		}
	}
	return users
}
