package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// readOnlyProcSys is the shell prologue that makes /proc/sys read-only for
// the command it then execs, in a mount namespace of its own (unshare -m),
// as LXC, Docker and systemd-nspawn do for a container's processes.
const readOnlyProcSys = `mount --bind /proc/sys /proc/sys && mount -o remount,bind,ro /proc/sys /proc/sys && exec "$@"`

// TestReadOnlyProcSys: where /proc/sys is read-only, espd starts when the
// effective reverse-path filter on its TUN, the larger of
// net.ipv4.conf.all.rp_filter and the TUN's own (which the kernel copies
// from conf/default), is off (0) or loose (2), and leaves it as it is; it
// refuses to start when that is strict (1), naming the sysctl to set on
// the host.
func TestReadOnlyProcSys(t *testing.T) {
	for _, c := range []struct {
		all, def string
		start    bool
	}{
		{"0", "0", true},
		{"2", "1", true},
		{"1", "2", true},
		{"0", "1", false},
		{"1", "0", false},
		{"1", "1", false},
	} {
		t.Run(fmt.Sprintf("all=%s,default=%s", c.all, c.def), func(t *testing.T) {
			node := testbed.NewNodeT(t, "gw")
			for k, v := range map[string]string{"all": c.all, "default": c.def} {
				if err := node.Sysctl("net.ipv4.conf."+k+".rp_filter", v); err != nil {
					t.Fatal(err)
				}
			}
			dir := t.TempDir()
			sock := filepath.Join(dir, "espd.sock")
			p, err := node.Start(filepath.Join(dir, "espd.log"),
				"unshare", "-m", "--propagation", "private", "sh", "-c", readOnlyProcSys, "sh",
				espdBin, "--tun", tunName, "--socket", sock, "--state-dir", filepath.Join(dir, "state"),
				"--workers", "1", "--log-format", "text")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.Stop(10 * time.Second) })
			if !c.start {
				select {
				case <-p.Done():
				case <-time.After(30 * time.Second):
					t.Fatalf("espd still runs after 30 s on a strict rp_filter it cannot change\nlog:\n%s", tail(p.Log(), 40))
				}
				_, err := p.Exited()
				log := p.Log()
				if err == nil {
					t.Errorf("espd exited with status 0 on a strict rp_filter")
				}
				for _, want := range []string{"read-only file system", "sysctl -w net.ipv4.conf.all.rp_filter=2",
					"all=" + c.all + ", " + tunName + "=" + c.def} {
					if !strings.Contains(log, want) {
						t.Errorf("espd's refusal does not say %q:\n%s", want, tail(log, 40))
					}
				}
				t.Logf("espd refused:\n%s", tail(log, 2))
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := testbed.WaitEspd(ctx, node, p, sock, tunName); err != nil {
				t.Fatalf("espd did not start with all=%s, default=%s under a read-only /proc/sys: %v\nlog:\n%s",
					c.all, c.def, err, tail(p.Log(), 40))
			}
			// The TUN keeps the value it got from conf/default: espd could
			// not write it (a writable /proc/sys would have made it 2).
			var got []byte
			if err := node.Do(func() (err error) {
				got, err = os.ReadFile("/proc/sys/net/ipv4/conf/" + tunName + "/rp_filter")
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if strings.TrimSpace(string(got)) != c.def {
				t.Errorf("the TUN's rp_filter is %q, want %s (unchanged: /proc/sys is read-only)", got, c.def)
			}
			if err := p.Stop(10 * time.Second); err != nil {
				t.Errorf("espd: %v\nlog:\n%s", err, tail(p.Log(), 40))
			}
		})
	}
}
