package routing

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/espd/espd/statefile"
)

// The hold file (Config.HoldFile) records what is held, so that the holds
// can be put back before the network comes up at the next boot
// (RestoreHolds), when the kernel's table and rules are empty and no IKE
// daemon has negotiated yet: the source prefixes whose rules send packets
// to the table ("from" lines) and the held destination prefixes. Its
// format is text, one a line between a header and a trailer that counts
// the lines between them:
//
//	espd holds 2
//	from 198.18.1.0/24
//	from ::/0
//	198.18.2.0/24
//	2001:db8:2::/64
//	end 4
//
// Format 1 ("espd holds 1", prefixes only) is what espd wrote before its
// rules followed the policies' sources, when one rule per family sent
// every unmarked packet to the table: it is read as the 0.0.0.0/0 and ::/0
// sources of each family its prefixes have.
//
// It is replaced atomically (statefile.Replace: written beside, fsynced,
// renamed, directory fsynced); a file without its trailer, with a count that disagrees or a
// line that is not a prefix is refused, never half read.
const (
	holdFileHeader  = "espd holds 2"
	holdFileHeader1 = "espd holds 1"
)

// ErrHoldFile is what a hold file that cannot be trusted wraps.
var ErrHoldFile = errors.New("routing: hold file damaged")

// holdSet is what the hold file records: the sources whose rules are
// wanted and the held prefixes, each sorted.
type holdSet struct {
	sources, prefixes []netip.Prefix
}

func (a holdSet) equal(b holdSet) bool {
	return slices.Equal(a.sources, b.sources) && slices.Equal(a.prefixes, b.prefixes)
}

// readHoldFile returns what path records; a missing file records nothing.
func readHoldFile(path string) (holdSet, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return holdSet{}, nil
	}
	if err != nil {
		return holdSet{}, fmt.Errorf("routing: hold file %s: %w", path, err)
	}
	bad := func(line int, why string) error {
		return fmt.Errorf("%w: %s line %d: %s (remove it only if no prefix must stay closed: espd --cleanup)", ErrHoldFile, path, line, why)
	}
	parse := func(s string) (netip.Prefix, bool) {
		p, err := netip.ParsePrefix(s)
		return p, err == nil && p == p.Masked()
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	var out holdSet
	n, ended, version := 0, false, 0
	for sc.Scan() {
		n++
		line := sc.Text()
		switch {
		case ended:
			return holdSet{}, bad(n, "text after the trailer")
		case n == 1:
			switch line {
			case holdFileHeader:
				version = 2
			case holdFileHeader1:
				version = 1
			default:
				return holdSet{}, bad(n, fmt.Sprintf("header %q, want %q", line, holdFileHeader))
			}
		case strings.HasPrefix(line, "end "):
			c, err := strconv.Atoi(strings.TrimPrefix(line, "end "))
			if err != nil || c != len(out.sources)+len(out.prefixes) {
				return holdSet{}, bad(n, fmt.Sprintf("trailer %q for %d lines", line, len(out.sources)+len(out.prefixes)))
			}
			ended = true
		case version == 2 && strings.HasPrefix(line, "from "):
			p, ok := parse(strings.TrimPrefix(line, "from "))
			if !ok {
				return holdSet{}, bad(n, fmt.Sprintf("%q is not a source prefix", line))
			}
			out.sources = append(out.sources, p)
		default:
			p, ok := parse(line)
			if !ok {
				return holdSet{}, bad(n, fmt.Sprintf("%q is not a prefix", line))
			}
			out.prefixes = append(out.prefixes, p)
		}
	}
	if err := sc.Err(); err != nil {
		return holdSet{}, bad(n, err.Error())
	}
	if !ended {
		return holdSet{}, bad(n, "no trailer: the file is cut short")
	}
	if version == 1 {
		// One rule per family sent everything unmarked to the table.
		for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
			if slices.ContainsFunc(out.prefixes, func(p netip.Prefix) bool { return familyOf(p) == fam }) {
				out.sources = append(out.sources, anySource(fam))
			}
		}
	}
	return out, nil
}

// writeHoldFile replaces path with a record of held (in heldSet's
// order).
func writeHoldFile(path string, held holdSet) error {
	var buf bytes.Buffer
	buf.WriteString(holdFileHeader + "\n")
	for _, p := range held.sources {
		buf.WriteString("from " + p.String() + "\n")
	}
	for _, p := range held.prefixes {
		buf.WriteString(p.String() + "\n")
	}
	fmt.Fprintf(&buf, "end %d\n", len(held.sources)+len(held.prefixes))
	if err := statefile.Replace(path, buf.Bytes()); err != nil {
		return fmt.Errorf("routing: hold file: %w", err)
	}
	return nil
}

// heldSet lists the sources whose rules are wanted and the prefixes that
// are held now, sorted. r.mu is held.
func (r *Router) heldSet() holdSet {
	var out holdSet
	for p, e := range r.routes {
		if e.wantHold() {
			out.prefixes = append(out.prefixes, p)
		}
	}
	sortPrefixes(out.prefixes)
	out.sources = r.wantedSources()
	return out
}

func sortPrefixes(ps []netip.Prefix) { slices.SortFunc(ps, comparePrefix) }

// holdsChanged asks the hold writer to record what is held. r.mu is
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

// startHoldWriter records what is held now, before it returns (a hold
// file that cannot be written at start-up is New's error: the service
// fails visibly rather than run with a record the next boot would
// restore wrongly), and starts the writer of the later changes.
func (r *Router) startHoldWriter() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	held := r.heldSet()
	if err := writeHoldFile(r.cfg.HoldFile, held); err != nil {
		return err
	}
	r.holdWake, r.holdDone = make(chan struct{}, 1), make(chan struct{})
	go r.holdWriter(&held)
	return nil
}

// holdWriter records what is held whenever holdsChanged asks, until
// holdWake is closed; last is what the file holds now.
func (r *Router) holdWriter(last *holdSet) {
	defer close(r.holdDone)
	for range r.holdWake {
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return
		}
		held := r.heldSet()
		r.mu.Unlock()
		if last != nil && held.equal(*last) {
			continue
		}
		if err := writeHoldFile(r.cfg.HoldFile, held); err != nil {
			if r.cfg.HoldFileError != nil {
				r.cfg.HoldFileError(err)
			}
			continue
		}
		last = &held
	}
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// restoreFromFile holds every prefix the hold file lists that the table
// does not already hold, and adopts the sources it lists (their rules
// stay while a hold they may serve is unclaimed). r.mu is held (or r is
// not yet shared).
func (r *Router) restoreFromFile() error {
	if r.cfg.HoldFile == "" {
		return nil
	}
	held, err := readHoldFile(r.cfg.HoldFile)
	if err != nil {
		return err
	}
	if err := r.checkFamilies(held); err != nil {
		return err
	}
	for _, p := range held.prefixes {
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
		r.unclaimed++
	}
	for _, src := range held.sources {
		s := r.source(src)
		s.adopted = true
		if err := r.syncSource(src, s); err != nil {
			return err
		}
	}
	return nil
}

// checkFamilies refuses a record with IPv6 in it when IPv6 is disabled.
func (r *Router) checkFamilies(held holdSet) error {
	if !r.cfg.NoIPv6 {
		return nil
	}
	for _, p := range slices.Concat(held.sources, held.prefixes) {
		if p.Addr().Is6() {
			return fmt.Errorf("%w: %s holds IPv6 prefix %s, and IPv6 is disabled (--no-ipv6)", ErrHoldFile, r.cfg.HoldFile, p)
		}
	}
	return nil
}

// RestoreHolds puts back, in the calling thread's network namespace, the
// rules of the sources and the holds of the prefixes cfg.HoldFile lists,
// without a TUN and without a running espd: what a boot needs before its
// network comes up (espd --restore-holds). Holds and rules already there
// are kept. It returns what it added, one line each.
//
// A hold file that exists but cannot be trusted (damaged, unreadable, or
// with IPv6 under NoIPv6) must not open what it would have held: then it
// holds everything instead, 0.0.0.0/0 and ::/0 (HoldEverything), and
// returns what it added with an error wrapping ErrHoldFile that says so.
// Only a missing file means nothing is held.
func RestoreHolds(cfg Config) ([]string, error) {
	if cfg.HoldFile == "" {
		return nil, errors.New("routing: no hold file")
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	held, err := readHoldFile(cfg.HoldFile)
	if err == nil {
		err = (&Router{cfg: cfg}).checkFamilies(held)
	}
	var damaged error
	if err != nil {
		if !errors.Is(err, ErrHoldFile) {
			err = fmt.Errorf("%w: %w", ErrHoldFile, err)
		}
		damaged = fmt.Errorf("%w; holding every destination of every unmarked packet instead (blackhole %s in table %d, a rule "+
			"for any source) until the file is repaired or removed (docs/safety.md, Boot)", err, joinPrefixes(everything(&cfg)), cfg.Table)
		held = holdSet{sources: everything(&cfg), prefixes: everything(&cfg)}
	}
	if len(held.sources)+len(held.prefixes) == 0 {
		return nil, nil
	}
	done, err := restoreHeld(cfg, held)
	return done, errors.Join(damaged, err)
}

// everything is the /0 prefix of each of cfg's families.
func everything(cfg *Config) []netip.Prefix {
	var out []netip.Prefix
	for _, fam := range cfg.families() {
		out = append(out, anySource(fam))
	}
	return out
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, " and ")
}

// restoreHeld is RestoreHolds with what to hold. A hold or rule that
// cannot be added does not stop the others: it returns every failure.
func restoreHeld(cfg Config, held holdSet) ([]string, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("routing: netlink: %w", err)
	}
	defer h.Close()
	r := newRouter(cfg, h)
	var done []string
	var errs []error
	for _, p := range held.prefixes {
		rt := r.holdRoute(p)
		if err := h.RouteReplace(rt); err != nil {
			errs = append(errs, fmt.Errorf("routing: hold %s with a blackhole route in table %d: %w", p, cfg.Table, err))
			continue
		}
		done = append(done, "route "+describeRoute(rt))
	}
	if err := r.adoptRules(); err != nil {
		errs = append(errs, err)
	}
	r.added = &done
	for _, src := range held.sources {
		s := r.source(src)
		s.refs = 1 // wanted whatever else is held
		if err := r.syncSource(src, s); err != nil {
			errs = append(errs, err)
		}
	}
	for _, fam := range cfg.families() {
		if r.narrow[fam] > 0 {
			if err := r.ensureGuard(fam); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return done, errors.Join(errs...)
}
