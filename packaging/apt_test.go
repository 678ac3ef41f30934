package packaging

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// onePackage returns the base name of the one package name_*_GOARCH.deb
// in dir.
func onePackage(t *testing.T, dir, name string) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, name+"_*_"+runtime.GOARCH+".deb"))
	if len(m) != 1 {
		t.Fatalf("packaging/build.sh made %q, want one %s package", m, name)
	}
	return filepath.Base(m[0])
}

// aptMirror makes dir a flat apt repository with every package that
// installing the packages debs (in dir's parent) on rootfs would take from
// Debian, in the version the machine's apt picks, which for strongSwan is
// the one the plugin is pinned to.
func aptMirror(t *testing.T, rootfs, dir, release string, debs ...string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var lists []string // apt options for the release's package lists
	if release != "12" {
		lists = releaseLists(t, rootfs)
	}
	argv := append([]string{"install", "-s", "-o", "Dir::State::status=" + filepath.Join(rootfs, "var/lib/dpkg/status"),
		"-o", "APT::Install-Recommends=true"}, lists...)
	for _, d := range debs {
		argv = append(argv, "./"+d)
	}
	sim := exec.Command("apt-get", argv...)
	sim.Dir = filepath.Dir(dir)
	out, err := sim.CombinedOutput()
	if err != nil {
		t.Fatalf("apt-get %s: %v\n%s", strings.Join(argv, " "), err, out)
	}
	var want []string
	inst := regexp.MustCompile(`^Inst (\S+) (?:\[\S+\] )?\((\S+) (\S+)`)
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if m := inst.FindStringSubmatch(sc.Text()); m != nil && m[3] != "local-deb" {
			want = append(want, m[1]+"="+m[2])
		}
	}
	if len(want) == 0 {
		t.Fatalf("apt-get %s installs nothing from Debian:\n%s", strings.Join(argv, " "), out)
	}
	dl := exec.Command("apt-get", append(append([]string{"download", "-qq"}, lists...), want...)...)
	dl.Dir = dir
	if out, err := dl.CombinedOutput(); err != nil {
		t.Fatalf("apt-get download %s: %v\n%s", strings.Join(want, " "), err, out)
	}
	scan := exec.Command("dpkg-scanpackages", "--multiversion", ".")
	scan.Dir = dir
	idx, err := scan.Output()
	if err != nil {
		t.Fatalf("dpkg-scanpackages in %s: %v", dir, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "Packages"), idx, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("the containers' apt mirror: %s", strings.Join(want, " "))
}

// aptGet runs an apt-get command line in the container, in dir, and fails
// the test if it fails.
func aptGet(t *testing.T, c *container, dir, line string) {
	t.Helper()
	out, err := c.run(nil, "env", "DEBIAN_FRONTEND=noninteractive", "sh", "-ec", "cd "+dir+" && "+line)
	if err != nil {
		t.Fatalf("in the container, in %s: %s: %v\n%s", dir, line, err, out)
	}
}

// releaseLists fetches the package lists of the root file system's apt
// sources (its /etc/apt/sources.list) into a directory of the test's and
// returns the apt-get options that use them instead of the machine's.
func releaseLists(t *testing.T, rootfs string) []string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{"lists/partial", "cache/archives/partial"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := []string{
		"-o", "Dir::Etc::SourceList=" + filepath.Join(rootfs, "etc/apt/sources.list"),
		"-o", "Dir::Etc::SourceParts=" + filepath.Join(dir, "none"),
		"-o", "Dir::State::Lists=" + filepath.Join(dir, "lists"),
		"-o", "Dir::Cache=" + filepath.Join(dir, "cache"),
	}
	if out, err := exec.Command("apt-get", append([]string{"update", "-qq"}, opts...)...).CombinedOutput(); err != nil {
		t.Fatalf("apt-get update with %s's sources: %v\n%s", rootfs, err, out)
	}
	return opts
}
