package packaging

import (
	"fmt"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// transitCaptures capture the transit link at both ends, gateway A's and
// gateway B's, so that while one gateway's link is down (a reboot) the
// other end still sees everything that crosses.
type transitCaptures struct {
	bed  *packageBed
	live map[string]*testbed.Capture
	done []captureResult
}

type captureResult struct {
	side    string
	res     *testbed.CaptureResult
	summary string
}

func newTransitCaptures(t *testing.T, bed *packageBed) *transitCaptures {
	t.Helper()
	c := &transitCaptures{bed: bed, live: map[string]*testbed.Capture{}}
	t.Cleanup(func() {
		for _, k := range c.live {
			k.Stop()
		}
	})
	c.resume(t, "A")
	c.resume(t, "B")
	return c
}

// resume starts capturing at the gateway's end.
func (c *transitCaptures) resume(t *testing.T, name string) {
	t.Helper()
	k, err := c.bed.node(name).StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 256})
	if err != nil {
		t.Fatal(err)
	}
	c.live[name] = k
}

// pause stops capturing at the gateway's end and keeps what it saw.
func (c *transitCaptures) pause(t *testing.T, name string) {
	t.Helper()
	k := c.live[name]
	delete(c.live, name)
	res, err := k.Stop()
	if err != nil {
		t.Fatalf("capture at gateway %s's end: %v", name, err)
	}
	c.done = append(c.done, captureResult{side: "at " + name, res: res,
		summary: fmt.Sprintf("at %s's end until %s: %s", name, time.Now().Format("15:04:05.000"), res.Summary())})
}

// leaksSince returns how many cleartext frames of the LANs the live
// captures have seen since at.
func (c *transitCaptures) leaksSince(at time.Time) int {
	n := 0
	for _, k := range c.live {
		r := testbed.CaptureResult{Frames: k.Frames()}
		for _, f := range r.Leaks(lanAddrs...) {
			if f.Time.After(at) {
				n++
			}
		}
	}
	return n
}

// stop ends the captures and returns all they saw.
func (c *transitCaptures) stop(t *testing.T) []captureResult {
	t.Helper()
	for _, name := range []string{"A", "B"} {
		if c.live[name] != nil {
			c.pause(t, name)
		}
	}
	return c.done
}
