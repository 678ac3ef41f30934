package routing

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The hold file (Config.HoldFile) records which prefixes are held, so that
// the holds can be put back before the network comes up at the next boot
// (RestoreHolds), when the kernel's table is empty and no IKE daemon has
// negotiated yet. Its format is text, one prefix a line between a header
// and a trailer that counts them:
//
//	espd holds 1
//	198.18.2.0/24
//	2001:db8:2::/64
//	end 2
//
// It is replaced atomically (written beside, fsynced, renamed, directory
// fsynced); a file without its trailer, with a count that disagrees or a
// line that is not a prefix is refused, never half read.
const holdFileHeader = "espd holds 1"

// ErrHoldFile is what a hold file that cannot be trusted wraps.
var ErrHoldFile = errors.New("routing: hold file damaged")

// readHoldFile returns the prefixes path lists; a missing file lists none.
func readHoldFile(path string) ([]netip.Prefix, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("routing: hold file %s: %w", path, err)
	}
	bad := func(line int, why string) error {
		return fmt.Errorf("%w: %s line %d: %s (remove it only if no prefix must stay closed: espd --cleanup)", ErrHoldFile, path, line, why)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	var out []netip.Prefix
	n, ended := 0, false
	for sc.Scan() {
		n++
		line := sc.Text()
		switch {
		case ended:
			return nil, bad(n, "text after the trailer")
		case n == 1:
			if line != holdFileHeader {
				return nil, bad(n, fmt.Sprintf("header %q, want %q", line, holdFileHeader))
			}
		case strings.HasPrefix(line, "end "):
			c, err := strconv.Atoi(strings.TrimPrefix(line, "end "))
			if err != nil || c != len(out) {
				return nil, bad(n, fmt.Sprintf("trailer %q for %d prefixes", line, len(out)))
			}
			ended = true
		default:
			p, err := netip.ParsePrefix(line)
			if err != nil || p != p.Masked() {
				return nil, bad(n, fmt.Sprintf("%q is not a prefix", line))
			}
			out = append(out, p)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, bad(n, err.Error())
	}
	if !ended {
		return nil, bad(n, "no trailer: the file is cut short")
	}
	return out, nil
}

// writeHoldFile replaces path with a record of prefixes (in heldPrefixes'
// order).
func writeHoldFile(path string, prefixes []netip.Prefix) error {
	var buf bytes.Buffer
	buf.WriteString(holdFileHeader + "\n")
	for _, p := range prefixes {
		buf.WriteString(p.String() + "\n")
	}
	fmt.Fprintf(&buf, "end %d\n", len(prefixes))
	tmp := path + ".new"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("routing: hold file: %w", err)
	}
	_, err = f.Write(buf.Bytes())
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("routing: hold file %s: %w", path, err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		err = d.Sync()
		d.Close()
		if err != nil {
			return fmt.Errorf("routing: hold file %s: sync directory: %w", path, err)
		}
	}
	return nil
}

// heldPrefixes lists the prefixes that are held now, sorted. r.mu is
// held.
func (r *Router) heldPrefixes() []netip.Prefix {
	var out []netip.Prefix
	for p, e := range r.routes {
		if e.wantHold() {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, comparePrefix)
	return out
}

// holdsChanged asks the hold writer to record the held prefixes. r.mu is
// held. The write is asynchronous so that installing many policies costs
// one write, not one each; Close writes the final set itself.
func (r *Router) holdsChanged() {
	if r.holdWake == nil {
		return
	}
	select {
	case r.holdWake <- struct{}{}:
	default:
	}
}

// holdWriter records the held prefixes whenever holdsChanged asks, until
// holdWake is closed.
func (r *Router) holdWriter() {
	defer close(r.holdDone)
	var last []netip.Prefix
	for range r.holdWake {
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return
		}
		held := r.heldPrefixes()
		r.mu.Unlock()
		if last != nil && slices.Equal(held, last) {
			continue
		}
		if err := writeHoldFile(r.cfg.HoldFile, held); err != nil {
			if r.cfg.HoldFileError != nil {
				r.cfg.HoldFileError(err)
			}
			continue
		}
		last = held
	}
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// restoreFromFile holds every prefix the hold file lists that the table
// does not already hold. r.mu is held (or r is not yet shared).
func (r *Router) restoreFromFile() error {
	if r.cfg.HoldFile == "" {
		return nil
	}
	prefixes, err := readHoldFile(r.cfg.HoldFile)
	if err != nil {
		return err
	}
	for _, p := range prefixes {
		if r.cfg.NoIPv6 && p.Addr().Is6() {
			return fmt.Errorf("%w: %s holds IPv6 prefix %s, and IPv6 is disabled (--no-ipv6)", ErrHoldFile, r.cfg.HoldFile, p)
		}
		e := r.routes[p]
		if e == nil {
			e = &entry{}
			r.routes[p] = e
		}
		if e.wantHold() {
			continue
		}
		e.adoptedHold = true
		if err := r.sync(p, e); err != nil {
			return err
		}
		r.adopted++
	}
	return nil
}

// RestoreHolds puts back, in the calling thread's network namespace, the
// rules and the holds of every prefix cfg.HoldFile lists, without a TUN
// and without a running espd: what a boot needs before its network comes
// up (espd --restore-holds). Holds and rules already there are kept. It
// returns what it added, one line each.
func RestoreHolds(cfg Config) ([]string, error) {
	if cfg.HoldFile == "" {
		return nil, errors.New("routing: no hold file")
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	prefixes, err := readHoldFile(cfg.HoldFile)
	if err != nil || len(prefixes) == 0 {
		return nil, err
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("routing: netlink: %w", err)
	}
	defer h.Close()
	r := &Router{cfg: cfg, h: h, routes: make(map[netip.Prefix]*entry)}
	var done []string
	for _, p := range prefixes {
		if cfg.NoIPv6 && p.Addr().Is6() {
			return done, fmt.Errorf("%w: %s holds IPv6 prefix %s, and IPv6 is disabled (--no-ipv6)", ErrHoldFile, cfg.HoldFile, p)
		}
		rt := r.holdRoute(p)
		if err := h.RouteReplace(rt); err != nil {
			return done, fmt.Errorf("routing: hold %s with a blackhole route in table %d: %w", p, cfg.Table, err)
		}
		done = append(done, "route "+describeRoute(rt))
	}
	for _, fam := range cfg.families() {
		n := len(r.rules)
		if err := r.ensureRule(fam); err != nil {
			return done, err
		}
		if len(r.rules) > n {
			done = append(done, "rule "+ruleString(r.rules[n]))
		}
	}
	return done, nil
}
