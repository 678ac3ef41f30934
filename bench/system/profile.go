package system

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/espd/espd/testbed"
)

// ProfileAddr is where espd serves net/http/pprof (--pprof-listen) on its
// gateway's loopback when Env.Profile is on: each gateway is a namespace of
// its own, so both use the same address.
const ProfileAddr = "127.0.0.1:6061"

// Profiler is a system whose gateway processes can record CPU profiles.
type Profiler interface {
	// ProfileCPU records a CPU profile of gwA's and gwB's data-plane
	// process over the next d into pathA and pathB.
	ProfileCPU(ctx context.Context, d time.Duration, pathA, pathB string) error
}

// espdExtra returns the flags every espd the harness starts gets from env.
func (e *Env) espdExtra() []string {
	if !e.Profile {
		return nil
	}
	return []string{"--pprof-listen", ProfileAddr}
}

// ProfileCPU implements Profiler: both gateways at once.
func (e *Espd) ProfileCPU(ctx context.Context, d time.Duration, pathA, pathB string) error {
	if !e.env.Profile {
		return errors.New("system: espd runs without --pprof-listen (Env.Profile off)")
	}
	errc := make(chan error, 2)
	for i, path := range []string{pathA, pathB} {
		go func() { errc <- fetchProfile(ctx, e.gw[i].node, d, path) }()
	}
	return errors.Join(<-errc, <-errc)
}

// fetchProfile asks the pprof server on node's ProfileAddr for a CPU
// profile of d (rounded up to whole seconds) and writes it to path.
func fetchProfile(ctx context.Context, node *testbed.Node, d time.Duration, path string) error {
	var c net.Conn
	if err := node.Do(func() error {
		var err error
		c, err = net.DialTimeout("tcp", ProfileAddr, 5*time.Second)
		return err
	}); err != nil {
		return fmt.Errorf("system: pprof on %s: %w", node.Role, err)
	}
	used := false
	client := &http.Client{
		Timeout: d + 30*time.Second,
		Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(context.Context, string, string) (net.Conn, error) {
			// The one connection, opened in the namespace above.
			if used {
				return nil, errors.New("system: pprof connection already used")
			}
			used = true
			return c, nil
		}},
	}
	secs := int((d + time.Second - 1) / time.Second)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", ProfileAddr, secs), nil)
	if err != nil {
		c.Close()
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("system: pprof on %s: %w", node.Role, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("system: pprof on %s: %s: %s", node.Role, resp.Status, b)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
