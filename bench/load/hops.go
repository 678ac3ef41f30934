package load

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/espd/espd/testbed"
)

// Hops is where one echo's round trip went, from the kernel's time stamps
// of the frames at the two gateways' LAN and transit interfaces: A is the
// client's gateway, B the server's.
type Hops struct {
	AOut   time.Duration // A: the request from the LAN link to the transit link
	BIn    time.Duration // B: the request from the transit link to the LAN link
	Server time.Duration // from B's LAN link to the server and back
	BOut   time.Duration // B: the reply from the LAN link to the transit link
	AIn    time.Duration // A: the reply from the transit link to the LAN link
	Wire   time.Duration // both crossings of the transit link
	Client time.Duration // the rest of the round trip: the client and its link
}

// HopCapture records the frames a ping crosses at the gateways.
type HopCapture struct {
	aLAN, aWAN, bWAN, bLAN *testbed.Capture
}

// StartHopCapture starts capturing the LAN and transit interfaces of the
// topology's two gateways.
func StartHopCapture(top *testbed.Topology) (*HopCapture, error) {
	h := &HopCapture{}
	for _, c := range []struct {
		k      **testbed.Capture
		n      *testbed.Node
		ifname string
	}{{&h.aLAN, top.GwA, testbed.IfLAN}, {&h.aWAN, top.GwA, testbed.IfTransit}, {&h.bWAN, top.GwB, testbed.IfTransit}, {&h.bLAN, top.GwB, testbed.IfLAN}} {
		k, err := c.n.StartCapture(c.ifname, testbed.CaptureOptions{Snaplen: 128, MaxFrames: 1 << 16})
		if err != nil {
			h.stop()
			return nil, err
		}
		*c.k = k
	}
	return h, nil
}

func (h *HopCapture) stop() (frames [4][]testbed.Frame, err error) {
	for i, k := range []*testbed.Capture{h.aLAN, h.aWAN, h.bWAN, h.bLAN} {
		if k == nil {
			continue
		}
		res, serr := k.Stop()
		err = errors.Join(err, serr)
		if res != nil {
			frames[i] = res.Frames
		}
	}
	return frames, err
}

// Stop ends the captures and returns the hops of each request of rtt that
// the captures could follow through both gateways.
func (h *HopCapture) Stop(rtt RTT) ([]Hops, error) {
	f, err := h.stop()
	if err != nil {
		return nil, err
	}
	return FollowEchoes(rtt, f[0], f[1], f[2], f[3])
}

// FollowEchoes follows each answered request of rtt through the frames
// captured at A's LAN and transit interfaces and B's transit and LAN
// interfaces. On the transit link a request is the first frame A sends
// after the request reached it (ESP, ESP-in-UDP, WireGuard or the echo
// itself: the path is idle but for the ping), and B receives the first
// frame of the same length after that; the reply likewise. It fails when
// fewer than half the requests can be followed.
func FollowEchoes(rtt RTT, aLAN, aWAN, bWAN, bLAN []testbed.Frame) ([]Hops, error) {
	var out []Hops
	answered := 0
	for seq, d := range rtt.Each {
		if d <= 0 {
			continue
		}
		answered++
		echo := func(frames []testbed.Frame, outgoing, reply bool) (time.Time, bool) {
			for i := range frames {
				f := &frames[i]
				if id, s, r, ok := f.Echo(); ok && f.Outgoing == outgoing && id == rtt.ID && int(s) == seq%65536 && r == reply {
					return f.Time, true
				}
			}
			return time.Time{}, false
		}
		t0, ok0 := echo(aLAN, false, false)
		t3, ok3 := echo(bLAN, true, false)
		t4, ok4 := echo(bLAN, false, true)
		t7, ok7 := echo(aLAN, true, true)
		if !ok0 || !ok3 || !ok4 || !ok7 {
			continue
		}
		t1, t2, okReq := crossing(aWAN, bWAN, t0, t3)
		t5, t6, okRep := crossing(bWAN, aWAN, t4, t7)
		if !okReq || !okRep {
			continue
		}
		out = append(out, Hops{
			AOut: t1.Sub(t0), Wire: t2.Sub(t1) + t6.Sub(t5), BIn: t3.Sub(t2),
			Server: t4.Sub(t3), BOut: t5.Sub(t4), AIn: t7.Sub(t6), Client: d - t7.Sub(t0),
		})
	}
	if answered == 0 || 2*len(out) < answered {
		return out, fmt.Errorf("load: followed %d of %d answered requests through the gateways' captures", len(out), answered)
	}
	return out, nil
}

// crossing finds the frame that carried a packet over the transit link:
// the first one the sending side sent in (after, before) and the first
// one of the same length the receiving side received after it.
func crossing(from, to []testbed.Frame, after, before time.Time) (sent, received time.Time, ok bool) {
	var length int
	for i := range from {
		f := &from[i]
		if f.Outgoing && f.Time.After(after) && f.Time.Before(before) && carrier(f) {
			sent, length, ok = f.Time, f.Len, true
			break
		}
	}
	if !ok {
		return sent, received, false
	}
	for i := range to {
		f := &to[i]
		if !f.Outgoing && f.Len == length && !f.Time.Before(sent.Add(-time.Millisecond)) && f.Time.Before(before) {
			return sent, f.Time, true
		}
	}
	return sent, received, false
}

// carrier reports whether a transit frame may carry the ping: the echo
// itself (plain routing), or an IP packet longer than a keepalive (NAT-T's
// 29 bytes, WireGuard's 60) that is not IKE or neighbour discovery.
func carrier(f *testbed.Frame) bool {
	if _, _, _, ok := f.Echo(); ok {
		return true
	}
	return (f.EtherType == testbed.EtherTypeIPv4 || f.EtherType == testbed.EtherTypeIPv6) &&
		f.Class != testbed.ClassIKE && f.Class != testbed.ClassLink && f.Len > 64
}

// MedianHops returns the median of each hop over hs.
func MedianHops(hs []Hops) Hops {
	med := func(get func(Hops) time.Duration) time.Duration {
		v := make([]time.Duration, len(hs))
		for i, h := range hs {
			v[i] = get(h)
		}
		slices.Sort(v)
		if len(v) == 0 {
			return 0
		}
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	return Hops{
		AOut:   med(func(h Hops) time.Duration { return h.AOut }),
		BIn:    med(func(h Hops) time.Duration { return h.BIn }),
		Server: med(func(h Hops) time.Duration { return h.Server }),
		BOut:   med(func(h Hops) time.Duration { return h.BOut }),
		AIn:    med(func(h Hops) time.Duration { return h.AIn }),
		Wire:   med(func(h Hops) time.Duration { return h.Wire }),
		Client: med(func(h Hops) time.Duration { return h.Client }),
	}
}
