package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/espd/espd/testbed"
)

// linkDrops reads the dropped-packet counters (tx_dropped + rx_dropped)
// of every interface of n, by name.
func linkDrops(n *testbed.Node) (map[string]uint64, error) {
	out := map[string]uint64{}
	err := n.Do(func() error {
		h, err := netlink.NewHandle()
		if err != nil {
			return err
		}
		defer h.Close()
		links, err := h.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if s := l.Attrs().Statistics; s != nil {
				out[l.Attrs().Name] = s.TxDropped + s.RxDropped
			}
		}
		return nil
	})
	return out, err
}

// dropsDelta returns what moved from before to after (an interface that
// appeared counts from zero); nil if nothing did.
func dropsDelta(before, after map[string]uint64) map[string]uint64 {
	var d map[string]uint64
	for name, v := range after {
		if v > before[name] {
			if d == nil {
				d = map[string]uint64{}
			}
			d[name] = v - before[name]
		}
	}
	return d
}

// dropsSummary is "gwA esp0 1234, gwB esp0 5" for the progress line, or
// "" if nothing dropped.
func dropsSummary(a, b map[string]uint64) string {
	var parts []string
	for _, side := range []struct {
		name string
		d    map[string]uint64
	}{{"gwA", a}, {"gwB", b}} {
		total := uint64(0)
		for _, v := range side.d {
			total += v
		}
		if total == 0 {
			continue
		}
		var names []string
		for _, n := range slices.Sorted(maps.Keys(side.d)) {
			names = append(names, fmt.Sprintf("%s %d", n, side.d[n]))
		}
		parts = append(parts, side.name+" "+strings.Join(names, " "))
	}
	return strings.Join(parts, ", ")
}
