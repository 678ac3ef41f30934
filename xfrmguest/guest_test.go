package xfrmguest_test

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
	"github.com/espd/espd/xfrmguest"
)

// bootT builds the image of the kernel series (one of xfrmguest.Kernels),
// or finds it cached, and boots a guest at 198.18.0.2/24 and
// 2001:db8::2/64 behind a tap device at 198.18.0.1/24 and 2001:db8::1/64
// in a namespace of its own; files are extra files for
// the guest (Options.Files). It skips only where qemu cannot run at all,
// and fails instead under CI=true.
func bootT(t *testing.T, series string, files map[string]string) (*testbed.Node, *xfrmguest.Guest) {
	t.Helper()
	if err := xfrmguest.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	node := testbed.NewNodeT(t, "xfrmguest")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	img := buildT(t, ctx, series)
	g, err := xfrmguest.Boot(ctx, img, xfrmguest.Options{
		Node: node, Tap: "tap0", Addr: "198.18.0.2/24", Addr6: "2001:db8::2/64",
		Files: files, WorkDir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Logf("stopping qemu: %v", err)
		}
	})
	t.Logf("guest (kernel %s) booted in %v", img.KernelVersion, g.BootTime.Round(time.Millisecond))
	node.MustIP(t, "addr", "add", "198.18.0.1/24", "dev", "tap0")
	node.MustIP(t, "addr", "add", "2001:db8::1/64", "dev", "tap0", "nodad")
	return node, g
}

// images are the guest images by kernel series, each built (or found in
// the cache) once for the package's tests.
var images struct {
	sync.Mutex
	m map[string]xfrmguest.Image
}

// buildT returns the image of the kernel series, running build.sh for it
// the first time.
func buildT(t *testing.T, ctx context.Context, series string) xfrmguest.Image {
	t.Helper()
	images.Lock()
	defer images.Unlock()
	if img, ok := images.m[series]; ok {
		return img
	}
	start := time.Now()
	img, err := xfrmguest.BuildKernel(ctx, "build.sh", series)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image %s (kernel %s) ready in %v", img.Dir, img.KernelVersion, time.Since(start).Round(time.Millisecond))
	if images.m == nil {
		images.m = map[string]xfrmguest.Image{}
	}
	images.m[series] = img
	return img
}

// eachKernel runs f as a subtest "linux<series>" for each kernel of
// xfrmguest.Kernels.
func eachKernel(t *testing.T, f func(t *testing.T, series string)) {
	for _, k := range xfrmguest.Kernels {
		t.Run("linux"+k, func(t *testing.T) { f(t, k) })
	}
}

// TestGuestKernelHasESP boots the guest of each kernel (subtests linux6.1
// and linux6.12) and checks that it runs that kernel, with the
// /proc/net/xfrm_stat counters of its series, and has what this machine's
// own kernel lacks: an ESP state with rfc4106(gcm(aes)) (and
// one with rfc7539esp(chacha20,poly1305)) is accepted and reads back, and
// the guest answers a ping over the tap device on IPv4 and IPv6. An extra
// file given at boot is there and runs.
func TestGuestKernelHasESP(t *testing.T) { eachKernel(t, guestKernelHasESP) }

func guestKernelHasESP(t *testing.T, series string) {
	script := filepath.Join(t.TempDir(), "hello")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho hello from $0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	node, g := bootT(t, series, map[string]string{"/opt/espd/bin/hello": script})
	ctx := context.Background()

	out, err := g.MustRun(ctx, "uname -r; ip -o addr show dev eth0")
	if err != nil {
		t.Fatal(err)
	}
	if kv := buildT(t, ctx, series).KernelVersion; !strings.HasPrefix(out, kv+"\n") || !strings.HasPrefix(kv, series+".") {
		t.Fatalf("the guest does not run kernel %s of series %s:\n%s", kv, series, out)
	}
	if out, err := g.MustRun(ctx, "cat /proc/net/xfrm_stat"); err != nil {
		t.Error(err)
	} else if got, want := statNames(out), xfrmStatNames(series); !slices.Equal(got, want) {
		t.Errorf("the guest's /proc/net/xfrm_stat counts %v, want %v", got, want)
	}
	for _, want := range []string{"inet 198.18.0.2/24", "inet6 2001:db8::2/64"} {
		if !strings.Contains(out, want) {
			t.Fatalf("guest's eth0 has not %s:\n%s", want, out)
		}
	}
	for _, dst := range []string{"198.18.0.2", "2001:db8::2"} {
		res, err := node.Ping(ctx, netip.MustParseAddr(dst), testbed.PingOptions{Count: 3, Wait: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if !res.OK() {
			t.Fatalf("no ping replies from the guest's %s:\n%s", dst, res.Output)
		}
	}
	if out, err := g.MustRun(ctx, "/opt/espd/bin/hello"); err != nil || !strings.Contains(out, "hello from /opt/espd/bin/hello") {
		t.Fatalf("the extra file does not run in the guest: %v\n%s", err, out)
	}

	// Keys here are throwaway test vectors inside the guest; no espd key
	// is on a command line.
	for _, c := range []struct{ spi, aead string }{
		{"0x1001", "'rfc4106(gcm(aes))' 0x0102030405060708090a0b0c0d0e0f1011121314 128"},
		{"0x1002", "'rfc7539esp(chacha20,poly1305)' 0x0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f2021222324 128"},
	} {
		cmd := "ip xfrm state add src 198.18.0.2 dst 198.18.0.1 proto esp spi " + c.spi + " reqid 1 mode tunnel aead " + c.aead
		if _, err := g.MustRun(ctx, cmd); err != nil {
			t.Fatalf("the guest's kernel refused an ESP state: %v", err)
		}
	}
	out, err = g.MustRun(ctx, "ip xfrm state")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"spi 0x00001001", "rfc4106(gcm(aes))", "spi 0x00001002", "rfc7539esp(chacha20,poly1305)"} {
		if !strings.Contains(out, want) {
			t.Errorf("ip xfrm state lacks %q:\n%s", want, out)
		}
	}
	// A wrong key length must be refused: the check above is not an
	// accept-everything.
	if _, rc, err := g.Run(ctx, "ip xfrm state add src 198.18.0.2 dst 198.18.0.1 proto esp spi 0x1003 mode tunnel aead 'rfc4106(gcm(aes))' 0x0102 128"); err != nil || rc == 0 {
		t.Errorf("a 2-byte GCM key was accepted (rc %d, err %v)", rc, err)
	}
}

// xfrmStatNames returns the counters of /proc/net/xfrm_stat of the kernel
// series, in order: 6.12 adds the two of states with a direction (Linux
// 6.10), which docs/dev/xfrm-interop.md records.
func xfrmStatNames(series string) []string {
	names := []string{"XfrmInError", "XfrmInBufferError", "XfrmInHdrError", "XfrmInNoStates",
		"XfrmInStateProtoError", "XfrmInStateModeError", "XfrmInStateSeqError", "XfrmInStateExpired",
		"XfrmInStateMismatch", "XfrmInStateInvalid", "XfrmInTmplMismatch", "XfrmInNoPols",
		"XfrmInPolBlock", "XfrmInPolError", "XfrmOutError", "XfrmOutBundleGenError",
		"XfrmOutBundleCheckError", "XfrmOutNoStates", "XfrmOutStateProtoError", "XfrmOutStateModeError",
		"XfrmOutStateSeqError", "XfrmOutStateExpired", "XfrmOutPolBlock", "XfrmOutPolDead",
		"XfrmOutPolError", "XfrmFwdHdrError", "XfrmOutStateInvalid", "XfrmAcquireError"}
	if series == "6.12" {
		names = append(names, "XfrmOutStateDirError", "XfrmInStateDirError")
	}
	return names
}

// statNames returns the counter names of /proc/net/xfrm_stat, in order.
func statNames(out string) []string {
	var names []string
	for _, m := range statRE.FindAllStringSubmatch(out, -1) {
		names = append(names, m[1])
	}
	return names
}
