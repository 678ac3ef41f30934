package tun_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
	"github.com/espd/espd/tun"
	"github.com/espd/espd/xfrmguest"
)

// inGuestEnv tells TestInGuest that it runs inside the guest.
const inGuestEnv = "ESPD_TUN_IN_GUEST"

// TestURingOnGuestKernel runs TestWriteEveryPacket's and TestWriteErrors'
// checks, on both paths, on the kernel espd's package targets: Debian
// 12's, booted under qemu by xfrmguest, whose io_uring is older than this
// machine's. It builds this package's tests as a static binary, gives it
// to the guest and runs TestInGuest there (with CI=true, so that an
// io_uring the guest's kernel refuses fails rather than skips).
func TestURingOnGuestKernel(t *testing.T) {
	if err := xfrmguest.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	bin := filepath.Join(t.TempDir(), "tun.test")
	build := exec.Command("go", "test", "-c", "-o", bin, ".")
	build.Env = append(testbed.BuildEnv(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go test -c: %v\n%s", err, out)
	}
	node := testbed.NewNodeT(t, "tunguest")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	img, err := xfrmguest.Build(ctx, "../xfrmguest/build.sh")
	if err != nil {
		t.Fatal(err)
	}
	g, err := xfrmguest.Boot(ctx, img, xfrmguest.Options{
		Node: node, Tap: "tap0", Addr: "198.18.0.2/24",
		Files: map[string]string{"/bin/tun.test": bin}, WorkDir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := g.Close(); err != nil {
			t.Logf("stopping qemu: %v", err)
		}
	}()
	t.Logf("guest kernel %s", img.KernelVersion)
	out, err := g.MustRun(ctx, fmt.Sprintf("CI=true %s=1 /bin/tun.test -test.run '^TestInGuest$' -test.v -test.count=1 2>&1", inGuestEnv))
	t.Logf("in the guest:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--- PASS: TestInGuest/uring/every_packet", "--- PASS: TestInGuest/uring/errors", "--- PASS: TestInGuest/writev/every_packet", "--- PASS: TestInGuest/writev/errors"} {
		if !strings.Contains(out, want) {
			t.Errorf("the guest's output lacks %q", want)
		}
	}
	if strings.Contains(out, "--- SKIP") || strings.Contains(out, "--- FAIL") {
		t.Error("a case skipped or failed in the guest")
	}
}

// TestInGuest is TestURingOnGuestKernel's half inside the guest; it runs
// only there (inGuestEnv set), in the guest's own network namespace.
func TestInGuest(t *testing.T) {
	if os.Getenv(inGuestEnv) != "1" {
		t.Skip("runs inside TestURingOnGuestKernel's guest")
	}
	forEachPath(t, func(t *testing.T, noURing bool) {
		t.Run("every packet", func(t *testing.T) {
			writeEveryPacket(t, guestTUN(t, "esptest5", 107, noURing), noURing)
		})
		t.Run("errors", func(t *testing.T) {
			writeErrors(t, guestTUN(t, "esptest6", 109, noURing), noURing)
		})
	})
}

// guestTUN is forwardingTUN in the guest, which is a namespace of its own.
func guestTUN(t *testing.T, name string, n byte, noURing bool) *tun.Device {
	t.Helper()
	dev, err := tun.Create(tun.Config{Name: name, NoURing: noURing})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	checkPath(t, dev, noURing)
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, k := range []byte{n, n + 1} {
		dst := netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, k, 0}), 24).String()
		if out, err := exec.Command("ip", "route", "add", dst, "dev", name).CombinedOutput(); err != nil {
			t.Fatalf("ip route add %s: %v: %s", dst, err, out)
		}
	}
	return dev
}
