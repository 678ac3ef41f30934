package packaging

import (
	"fmt"
	"testing"
	"time"

	"github.com/espd/espd/testbed"
)

// transitCaptures capture the transit link at both ends, gateway A's and
// gateway B's, from their start to stop, across the gateways' power-offs
// and boots: a capture goes on while its end of the link is down (it
// records again from the moment the link comes up), so the capture of a
// boot began before the container started.
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
	for _, name := range []string{"A", "B"} {
		k, err := bed.node(name).StartCapture(testbed.IfTransit, testbed.CaptureOptions{Snaplen: 256, AcrossLinkDown: true})
		if err != nil {
			t.Fatal(err)
		}
		c.live[name] = k
	}
	return c
}

// frames returns what the capture at the gateway's end has seen so far.
func (c *transitCaptures) frames(name string) []testbed.Frame { return c.live[name].Frames() }

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
		k := c.live[name]
		delete(c.live, name)
		res, err := k.Stop()
		if err != nil {
			t.Fatalf("capture at gateway %s's end: %v", name, err)
		}
		c.done = append(c.done, captureResult{side: "at " + name, res: res,
			summary: fmt.Sprintf("at %s's end until %s: %s", name, time.Now().Format("15:04:05.000"), res.Summary())})
	}
	return c.done
}

// windowCounts describes what a capture saw in [from, to]: the frames, by
// class, and the cleartext frames of the LANs among them.
type windowCounts struct {
	frames, leaks int
	class         map[testbed.Class]int
}

// counts returns what the capture r saw in [from, to].
func counts(r *testbed.CaptureResult, from, to time.Time) windowCounts {
	var in testbed.CaptureResult
	for _, f := range r.Frames {
		if !f.Time.Before(from) && !f.Time.After(to) {
			in.Frames = append(in.Frames, f)
		}
	}
	return windowCounts{frames: len(in.Frames), leaks: len(in.Leaks(lanAddrs...)), class: in.Counts()}
}

// String is "N frames (esp E, ike I, link L, other O), cleartext C".
func (w windowCounts) String() string {
	return fmt.Sprintf("%d frames (esp %d, ike %d, link %d, other %d), cleartext %d", w.frames,
		w.class[testbed.ClassESP]+w.class[testbed.ClassESPInUDP], w.class[testbed.ClassIKE], w.class[testbed.ClassLink], w.class[testbed.ClassOther], w.leaks)
}
