package packaging

import (
	"debug/elf"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// pluginArches are the architectures TestPluginArches builds the plugin
// for besides this machine's, with the ELF machine and class of each.
var pluginArches = []struct {
	name    string
	machine elf.Machine
	class   elf.Class
}{
	{"arm64", elf.EM_AARCH64, elf.ELFCLASS64},
	{"armhf", elf.EM_ARM, elf.ELFCLASS32},
}

// TestPluginArches builds strongswan-espd for arm64 and armhf, for Debian
// 12 and 13, as README.md's "Packages" does (packaging/build.sh, which
// cross-compiles with strongswan/cross.sh), and checks each package: its
// Architecture, its version's +debREL, its pin to one exact strongSwan
// version, and its plugin: an ELF shared object for that architecture
// (armhf: hard-float EABI5) that needs libcharon and libstrongswan and
// exports espd_plugin_create. Each release's pin differs from the other's
// and is the same for both architectures. It needs root (build.sh's
// plugin) and Debian 13's build chroot (nspawnRootfs).
func TestPluginArches(t *testing.T) {
	nspawnRootfs(t, "13")
	debs := t.TempDir()
	build := exec.Command("bash", "build.sh", "--arch", "arm64 armhf", "--release", "12 13", "-o", debs)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("packaging/build.sh: %v\n%s", err, out)
	}
	pins := map[string]string{}
	for _, rel := range []string{"12", "13"} {
		for _, a := range pluginArches {
			m, _ := filepath.Glob(filepath.Join(debs, "strongswan-espd_*+deb"+rel+"_"+a.name+".deb"))
			if len(m) != 1 {
				t.Errorf("Debian %s, %s: packages %q, want one", rel, a.name, m)
				continue
			}
			pin := checkPluginDeb(t, m[0], rel, a.name, a.machine, a.class)
			if p, ok := pins[rel]; ok && p != pin {
				t.Errorf("Debian %s: %s is pinned to %q, the other architecture to %q", rel, a.name, pin, p)
			}
			pins[rel] = pin
		}
	}
	if pins["12"] != "" && pins["12"] == pins["13"] {
		t.Errorf("Debian 12's and 13's plugins are pinned to the same strongSwan %q", pins["12"])
	}
}

// checkPluginDeb checks one strongswan-espd package of Debian rel for arch
// and returns the strongSwan version it is pinned to. Every symbol the
// plugin imports must be exported by the libcharon and libstrongswan of
// that version and architecture (those strongswan/cross.sh linked
// against, in its sysroot) or be libc's.
func checkPluginDeb(t *testing.T, deb, rel, arch string, machine elf.Machine, class elf.Class) string {
	t.Helper()
	field := func(name string) string {
		out, err := exec.Command("dpkg-deb", "-f", deb, name).Output()
		if err != nil {
			t.Fatalf("dpkg-deb -f %s %s: %v", deb, name, err)
		}
		return strings.TrimSpace(string(out))
	}
	if got := field("Architecture"); got != arch {
		t.Errorf("%s: Architecture %q, want %q", filepath.Base(deb), got, arch)
	}
	pin := ""
	for _, d := range strings.Split(field("Depends"), ",") {
		d = strings.TrimSpace(d)
		if v, ok := strings.CutPrefix(d, "strongswan-libcharon (= "); ok {
			pin = strings.TrimSuffix(v, ")")
		}
	}
	if pin == "" || !strings.Contains(field("Depends"), "libstrongswan (= "+pin+")") {
		t.Errorf("%s: Depends %q pins no exact strongswan-libcharon and libstrongswan", filepath.Base(deb), field("Depends"))
	}

	root := t.TempDir()
	if out, err := exec.Command("dpkg-deb", "-x", deb, root).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x %s: %v\n%s", deb, err, out)
	}
	so := filepath.Join(root, "usr/lib/ipsec/plugins/libstrongswan-espd.so")
	f, err := elf.Open(so)
	if err != nil {
		t.Fatalf("%s: %v", filepath.Base(deb), err)
	}
	defer f.Close()
	if f.Machine != machine || f.Class != class || f.Type != elf.ET_DYN {
		t.Errorf("%s: the plugin is %v %v %v, want %v %v ET_DYN", filepath.Base(deb), f.Machine, f.Class, f.Type, machine, class)
	}
	if arch == "armhf" {
		// e_flags (offset 36 in a 32-bit ELF header, which debug/elf does
		// not expose): EABI version 5 and EF_ARM_ABI_FLOAT_HARD (0x400).
		b, err := os.ReadFile(so)
		if err != nil {
			t.Fatal(err)
		}
		if fl := binary.LittleEndian.Uint32(b[36:40]); fl>>24 != 5 || fl&0x400 == 0 {
			t.Errorf("%s: the plugin's ELF flags %#x are not hard-float EABI5", filepath.Base(deb), fl)
		}
	}
	needed, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	for _, lib := range []string{"libcharon.so.0", "libstrongswan.so.0"} {
		if !slices.Contains(needed, lib) {
			t.Errorf("%s: the plugin needs %q, not %s", filepath.Base(deb), needed, lib)
		}
	}
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(syms, func(s elf.Symbol) bool {
		return s.Name == "espd_plugin_create" && s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC
	}) {
		t.Errorf("%s: the plugin does not export espd_plugin_create", filepath.Base(deb))
	}
	checkImports(t, filepath.Base(deb), f, sysroot(rel, arch, pin))
	if _, err := os.Stat(filepath.Join(root, "etc/strongswan.d/charon/espd.conf")); err != nil {
		t.Errorf("%s: %v", filepath.Base(deb), err)
	}
	return pin
}

// sysroot is where strongswan/cross.sh unpacked arch's libcharon and
// libstrongswan of version pin for Debian rel: its cache on this machine
// (rel 12) or in the release's build chroot.
func sysroot(rel, arch, pin string) string {
	cache := "/var/cache/espd-strongswan"
	if rel != "12" {
		chroots := os.Getenv("ESPD_BUILD_CHROOT_CACHE")
		if chroots == "" {
			chroots = cache
		}
		cache = filepath.Join(chroots+"-"+rel, "chroot", cache)
	} else if c := os.Getenv("ESPD_SS_CACHE"); c != "" {
		cache = c
	}
	return filepath.Join(cache, "cross-"+arch, "sysroot-"+pin)
}

// checkImports fails the test when a symbol the plugin f imports is
// exported by neither libcharon nor libstrongswan in sysroot and has no
// glibc version (libc's symbols carry one).
func checkImports(t *testing.T, name string, f *elf.File, sysroot string) {
	t.Helper()
	exported := map[string]bool{}
	for _, lib := range []string{"libcharon.so.0", "libstrongswan.so.0"} {
		l, err := elf.Open(filepath.Join(sysroot, "usr/lib/ipsec", lib))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			return
		}
		syms, err := l.DynamicSymbols()
		l.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range syms {
			if s.Section != elf.SHN_UNDEF {
				exported[s.Name] = true
			}
		}
	}
	imports, err := f.ImportedSymbols()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range imports {
		if strings.HasPrefix(s.Version, "GLIBC_") {
			continue
		}
		n++
		if !exported[s.Name] {
			t.Errorf("%s: the plugin imports %s, which %s's libcharon and libstrongswan do not export", name, s.Name, sysroot)
		}
	}
	if n == 0 {
		t.Errorf("%s: the plugin imports nothing from libcharon or libstrongswan", name)
	}
}
