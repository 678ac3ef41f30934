package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/espd/espd/internal/docblock"
	"github.com/espd/espd/testbed"
)

// readmeServiceBlock returns docs/reference.md's commands that run espd as a
// service from a checkout, without the package: the one block marked
// "readme-service" ("```sh readme-service").
func readmeServiceBlock(t *testing.T) string {
	t.Helper()
	blocks, err := docblock.Blocks("../docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	m := docblock.Marked(blocks, "readme-service")
	if len(m) != 1 || m[0].Lang != "sh" {
		t.Fatalf("docs/reference.md: want one sh block marked readme-service, have %+v", m)
	}
	return m[0].Text
}

// TestReadmeServiceFromCheckout runs docs/reference.md's commands for espd as a
// service from a checkout, as written, in a Debian 12 and a Debian 13
// container booted with systemd, with the checkout's packaging/ and an espd built from it
// in /usr/local/sbin (the README's go build step: the container has no Go),
// and expects the unit active, running /usr/local/sbin/espd as user espd.
func TestReadmeServiceFromCheckout(t *testing.T) {
	for _, rel := range debianReleases {
		t.Run("debian"+rel, func(t *testing.T) { readmeServiceFromCheckout(t, nspawnRootfs(t, rel)) })
	}
}

func readmeServiceFromCheckout(t *testing.T, rootfs string) {
	block := readmeServiceBlock(t)

	dir := t.TempDir()
	checkout := filepath.Join(dir, "checkout")
	for _, f := range []string{"espd.service", "espd.sysusers"} {
		b, err := os.ReadFile(filepath.Join("systemd", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(checkout, "packaging", "systemd"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(checkout, "packaging", "systemd", f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Static, as the package's: the container's C library is its release's.
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "espd"), "../cmd/espd")
	build.Env = append(testbed.BuildEnv(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	c := bootContainer(t, rootfs, dir, testbed.NewNodeT(t, "ckout"))
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := c.run(nil, "journalctl", "--no-pager", "-u", "espd")
			t.Logf("journal of espd in the container:\n%s", testbed.Tail(out, 30))
		}
	})
	c.must(t, "chmod", "0666", "/dev/net/tun") // udev's mode; no udev here
	c.must(t, "install", "-m", "0755", "/mnt/espd/espd", "/usr/local/sbin/espd")
	if out, err := c.run(nil, "sh", "-ec", "cd /mnt/espd/checkout\n"+block); err != nil {
		t.Fatalf("docs/reference.md's service commands, as written: %v\n%s", err, out)
	}
	p := c.show(t, "espd", "ActiveState", "SubState", "MainPID", "ExecMainStatus")
	if p["ActiveState"] != "active" || p["SubState"] != "running" {
		t.Fatalf("espd after docs/reference.md's commands: %v, want active and running", p)
	}
	if exe := c.must(t, "readlink", "/proc/"+p["MainPID"]+"/exe"); strings.TrimSpace(exe) != "/usr/local/sbin/espd" {
		t.Errorf("the unit runs %q, want /usr/local/sbin/espd", strings.TrimSpace(exe))
	}
	uid := strings.TrimSpace(c.must(t, "id", "-u", "espd"))
	if status := c.must(t, "cat", "/proc/"+p["MainPID"]+"/status"); !strings.Contains(status, "Uid:\t"+uid+"\t") {
		t.Errorf("espd does not run as user espd (uid %s):\n%s", uid, status)
	}
	if mode := strings.TrimSpace(c.must(t, "stat", "-c", "%a %U %G", "/etc/espd/espd.toml")); mode != "640 root espd" {
		t.Errorf("/etc/espd/espd.toml is %q, want 640 root espd", mode)
	}
	c.must(t, "systemctl", "stop", "espd")
}
