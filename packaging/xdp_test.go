package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coreos/go-systemd/v22/unit"

	"github.com/espd/espd/testbed"
)

// xdpDropIn returns docs/afxdp.md's drop-in for espd.service, checking
// that it names its path first.
func xdpDropIn(t *testing.T) string {
	t.Helper()
	block := markedBlock(t, "../docs/afxdp.md", "ini", "xdp drop-in")
	if !strings.HasPrefix(block, "# /etc/systemd/system/"+plainUnit+".d/xdp.conf\n") {
		t.Fatalf("docs/afxdp.md's drop-in does not name its path first:\n%s", block)
	}
	return block
}

// withDropIn returns the unit name with the drop-in text applied, as
// systemd merges them: its settings follow the unit's, and an empty
// assignment resets a list.
func withDropIn(t *testing.T, name, dropin string) *unitFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(unitsDir, name))
	if err != nil {
		t.Fatal(err)
	}
	opts, err := unit.DeserializeOptions(strings.NewReader(string(b) + "\n" + dropin))
	if err != nil {
		t.Fatalf("%s with its drop-in: %v", name, err)
	}
	return &unitFile{name: name + " with its drop-in", opts: opts}
}

// TestXDPDropIn holds docs/afxdp.md's drop-in to what it promises:
// systemd-analyze verify takes espd.service with it, and espd started as
// the unit with it starts it (its user and capabilities, its ExecStart
// with the test's transit interface for eth0) receives through AF_XDP;
// started as the packaged unit alone with --xdp, espd falls back and says
// that it needs CAP_BPF.
func TestXDPDropIn(t *testing.T) {
	for _, tool := range []string{"setpriv", "env"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	dropin := xdpDropIn(t)
	if analyze, err := exec.LookPath("systemd-analyze"); err == nil {
		dir := t.TempDir()
		b, err := os.ReadFile(filepath.Join(unitsDir, plainUnit))
		if err != nil {
			t.Fatal(err)
		}
		unitPath := filepath.Join(dir, plainUnit)
		if err := os.WriteFile(unitPath, []byte(strings.ReplaceAll(string(b), espdPath, espdBin)), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(unitPath+".d", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(unitPath+".d", "xdp.conf"), []byte(strings.ReplaceAll(dropin, espdPath, espdBin)), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(analyze, "verify", "--recursive-errors=one", unitPath).CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Fatalf("systemd-analyze verify %s with docs/afxdp.md's drop-in: %v\n%s", plainUnit, err, out)
		}
	} else if os.Getenv("CI") == "true" {
		t.Fatal("CI=true and no systemd-analyze")
	}

	top := testbed.NewT(t, testbed.Options{Prefix: "xdpunit"})
	logs := func(s *service, want ...string) bool {
		return testbed.Poll(20*time.Second, 50*time.Millisecond, func() bool {
			return testbed.CountLines(s.proc.Log(), want...) > 0
		})
	}

	u := withDropIn(t, plainUnit, strings.ReplaceAll(dropin, "--xdp eth0", "--xdp "+testbed.IfTransit))
	s := startService(t, top.GwA, u, serviceRoot(t, "", nil), u.caps(t))
	s.expect(t, "READY=1")
	if !logs(s, "receiving ESP through AF_XDP", "device="+testbed.IfTransit) {
		t.Fatalf("espd under %s does not receive through AF_XDP:\n%s", u.name, s.proc.Log())
	}
	for _, line := range strings.Split(s.proc.Log(), "\n") {
		if strings.Contains(line, "AF_XDP") {
			t.Log(line)
		}
	}

	plain := loadUnit(t, plainUnit)
	exec := plain.execStart(t)
	onlyFlag := withDropIn(t, plainUnit, "[Service]\nExecStart=\nExecStart="+strings.Join(exec, " ")+" --xdp "+testbed.IfTransit+"\n")
	f := startService(t, top.GwB, onlyFlag, serviceRoot(t, "", nil), plain.caps(t))
	f.expect(t, "READY=1")
	if !logs(f, "AF_XDP receive unavailable", "CAP_BPF") {
		t.Fatalf("espd under the packaged unit with --xdp does not say that it falls back for want of CAP_BPF:\n%s", testbed.Tail(f.proc.Log(), 20))
	}
}
