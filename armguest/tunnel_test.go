package armguest_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/armguest"
	"github.com/espd/espd/armguest/guestproto"
	"github.com/espd/espd/testbed"
)

var espdBin, espctlBin string

func TestMain(m *testing.M) {
	os.Exit(testbed.EspdMain(m, "armguest", &espdBin, &espctlBin))
}

// The addresses: the client's LAN 198.18.1.0/24 behind the host's gateway
// (espd for this machine, in a namespace), the transit link 198.18.0.0/24
// between it and the guest, and the guest's own inner address, on its
// loopback, in 198.18.2.0/24.
var (
	clientAddr = netip.MustParseAddr("198.18.1.2")
	guestInner = netip.MustParseAddr("198.18.2.1")
)

// transferBytes is what the TCP transfer sends through the tunnel, and
// gets back from the guest's echo server.
const transferBytes = 1 << 20

// TestTunnel runs, for each ARM architecture (subtests arm64 and armhf),
// a manually keyed site-to-site tunnel between espd on this machine and
// espd cross-built for that architecture in a guest of Debian's kernel for
// it: a client behind this machine's gateway pings the guest's inner
// address and sends it 1 MiB over TCP, which the guest echoes back, checked
// byte for byte; a capture of the link between the gateways shows ESP and
// link housekeeping only, with no inner address in clear. arm64 uses
// AES-GCM (ARMv8's AES instructions), armhf ChaCha20-Poly1305 (the suite
// for ARM without them).
func TestTunnel(t *testing.T) {
	for _, a := range armguest.Archs {
		t.Run(a.Name, func(t *testing.T) {
			suite, keyLen := "aes128gcm16", 20
			if a.Name == "armhf" {
				suite, keyLen = "chacha20poly1305", 36
			}
			tunnel(t, a, suite, keyLen)
		})
	}
}

func tunnel(t *testing.T, a armguest.Arch, suite string, keyLen int) {
	if err := armguest.Available(a); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	gw := testbed.NewNodeT(t, "armgw")
	client := testbed.NewNodeT(t, "armcl")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dir := t.TempDir()

	start := time.Now()
	img, err := armguest.Build(ctx, "build.sh", a)
	if err != nil {
		t.Fatal(err)
	}
	guestEspd, guestInit := filepath.Join(dir, "espd-"+a.Name), filepath.Join(dir, "init-"+a.Name)
	for _, b := range []struct{ out, pkg string }{
		{guestEspd, testbed.EspdPackage}, {guestInit, "github.com/espd/espd/armguest/cmd/guestinit"},
	} {
		if err := armguest.GoBuild(ctx, a, b.out, b.pkg); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("kernel %s and the %s binaries ready in %v", img.KernelVersion, a.Name, time.Since(start).Round(time.Millisecond))

	// The client's LAN and the host's gateway.
	testbed.VethT(t, client, "eth0", gw, "lan0")
	client.MustIP(t, "addr", "add", clientAddr.String()+"/24", "dev", "eth0")
	client.MustIP(t, "route", "add", "default", "via", "198.18.1.1")
	gw.MustIP(t, "addr", "add", "198.18.1.1/24", "dev", "lan0")
	if err := gw.Sysctl("net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}

	// One key per direction, new for each run.
	keys := make([]string, 2)
	for i := range keys {
		k := make([]byte, keyLen)
		if _, err := rand.Read(k); err != nil {
			t.Fatal(err)
		}
		keys[i] = "0x" + hex.EncodeToString(k)
	}
	hostConf, guestConf := filepath.Join(dir, "host.toml"), filepath.Join(dir, "guest.toml")
	for _, c := range []struct {
		path                string
		local, remote       string
		localNet, remoteNet string
		outSPI, inSPI       int
		outKey, inKey       string
	}{
		{hostConf, "198.18.0.1", "198.18.0.2", "198.18.1.0/24", "198.18.2.0/24", 0x1001, 0x2001, keys[0], keys[1]},
		{guestConf, "198.18.0.2", "198.18.0.1", "198.18.2.0/24", "198.18.1.0/24", 0x2001, 0x1001, keys[1], keys[0]},
	} {
		conf := fmt.Sprintf(`[[sa]]
spi = %#x
dir = "out"
src = %q
dst = %q
suite = %q
enc_key = %q
reqid = 1

[[sa]]
spi = %#x
dir = "in"
src = %q
dst = %q
suite = %q
enc_key = %q
reqid = 1

[[policy]]
src = %q
dst = %q
dir = "out"
reqid = 1

[[policy]]
src = %q
dst = %q
dir = "in"
reqid = 1
`, c.outSPI, c.local, c.remote, suite, c.outKey, c.inSPI, c.remote, c.local, suite, c.inKey,
			c.localNet, c.remoteNet, c.remoteNet, c.localNet)
		if err := os.WriteFile(c.path, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	g, err := armguest.Boot(ctx, img, armguest.Options{
		Node: gw, Tap: "tap0", WorkDir: dir,
		Args: []string{"armguest.addr=198.18.0.2/24", "armguest.inner=" + guestInner.String() + "/32"},
		Files: map[string]string{
			"/init": guestInit, "/bin/espd": guestEspd, "/etc/espd/espd.conf": guestConf,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := g.Close(); err != nil {
			t.Logf("stopping qemu: %v", err)
		}
		if t.Failed() {
			t.Logf("guest console:\n%s", g.ConsoleTail(60))
		}
	})
	gw.MustIP(t, "addr", "add", "198.18.0.1/24", "dev", "tap0")
	capture, err := gw.StartCapture("tap0", testbed.CaptureOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "espd.sock")
	espd, err := gw.Start(filepath.Join(dir, "espd-host.log"), espdBin, "--config", hostConf, "--tun", "espd0",
		"--state-dir", filepath.Join(dir, "state"), "--socket", sock, "--no-ipv6")
	if err != nil {
		t.Fatal(err)
	}
	if err := testbed.WaitEspd(ctx, gw, espd, sock, "espd0"); err != nil {
		t.Fatalf("host espd: %v\n%s", err, espd.Log())
	}
	bootCtx, bootCancel := context.WithTimeout(ctx, armguest.BootTimeout)
	line, err := g.WaitConsole(bootCtx, guestproto.ReadyLine, guestproto.DoneLine)
	bootCancel()
	if err != nil {
		t.Fatal(err)
	}
	if line != guestproto.ReadyLine {
		t.Fatalf("the guest's espd did not come up: %s", line)
	}
	t.Logf("guest up (%s) %v after the build", a.Name, time.Since(start).Round(time.Millisecond))

	// Ping through the tunnel; the first requests may go while the
	// gateways still resolve each other's link addresses.
	var ping testbed.PingResult
	if !testbed.Poll(60*time.Second, 500*time.Millisecond, func() bool {
		ping, err = client.Ping(ctx, guestInner, testbed.PingOptions{Count: 3, Wait: 5 * time.Second})
		return err == nil && ping.OK()
	}) {
		t.Fatalf("no ping through the tunnel to the %s guest: %v\n%s", a.Name, err, ping.Output)
	}

	// 1 MiB to the guest's echo server and back, compared byte for byte.
	sent := make([]byte, transferBytes)
	if _, err := rand.Read(sent); err != nil {
		t.Fatal(err)
	}
	var got []byte
	err = client.Do(func() error {
		var err error
		got, err = echo(ctx, netip.AddrPortFrom(guestInner, guestproto.EchoPort), sent)
		return err
	})
	if err != nil {
		t.Fatalf("TCP transfer through the tunnel: %v", err)
	}
	if !bytes.Equal(got, sent) {
		t.Fatalf("the echo of %d bytes came back as %d bytes that differ", len(sent), len(got))
	}

	res, err := capture.Stop()
	if err != nil {
		t.Fatal(err)
	}
	checkCapture(t, res, 2*transferBytes)
	t.Logf("%s: ping and %d bytes each way through the tunnel, in %v in all", a.Name, transferBytes,
		time.Since(start).Round(time.Millisecond))
}

// echo connects to addr, sends data, closes its side and returns what came
// back, within 3 minutes (the guest is emulated).
func echo(ctx context.Context, addr netip.AddrPort, data []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return nil, err
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	c.SetDeadline(dl)
	werr := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.(*net.TCPConn).CloseWrite()
		}
		werr <- err
	}()
	got, rerr := io.ReadAll(c)
	if err := <-werr; err != nil {
		return got, fmt.Errorf("send: %w", err)
	}
	if rerr != nil {
		return got, fmt.Errorf("receive: %w", rerr)
	}
	return got, nil
}

// checkCapture fails the test when the link's capture is incomplete, shows
// an inner address in clear or a frame that is neither ESP nor link
// housekeeping, or carries fewer ESP payload bytes than the inner bytes
// that crossed it (wantBytes).
func checkCapture(t *testing.T, res *testbed.CaptureResult, wantBytes int) {
	t.Helper()
	if res.Drops > 0 || res.Overflow > 0 {
		t.Errorf("capture incomplete: %d dropped, %d beyond its bound", res.Drops, res.Overflow)
	}
	if leaks := res.Leaks(clientAddr, guestInner); len(leaks) > 0 {
		t.Errorf("%d frames show an inner address in clear, the first: %s", len(leaks), leaks[0].String())
	}
	var esp, espBytes int
	var other []string
	for i := range res.Frames {
		f := &res.Frames[i]
		switch f.Class {
		case testbed.ClassESP:
			esp++
			espBytes += f.Len
		case testbed.ClassLink:
		default:
			other = append(other, f.String())
		}
	}
	if len(other) > 0 {
		t.Errorf("%d frames on the link are neither ESP nor link housekeeping:\n%s", len(other),
			strings.Join(other[:min(len(other), 10)], "\n"))
	}
	if espBytes < wantBytes {
		t.Errorf("%d ESP packets of %d bytes in all on the link, fewer than the %d bytes that crossed it", esp, espBytes, wantBytes)
	}
	t.Logf("capture: %d frames, %d ESP (%d bytes)", len(res.Frames), esp, espBytes)
}
