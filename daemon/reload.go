package daemon

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"reflect"

	"github.com/espd/espd/config"
	"github.com/espd/espd/sa"
)

// saKey identifies a state as XFRM does: SPI and destination.
type saKey struct {
	spi uint32
	dst netip.Addr
}

// policyKey identifies a policy: selector and direction.
type policyKey struct {
	sel sa.Selector
	dir sa.Direction
}

// fileState is what the configuration file installed, so that a reload
// knows what to change and leaves what the control socket installed alone.
// It holds no keys: a digest tells whether they changed.
type fileState struct {
	sas      map[saKey]fileSA
	policies map[policyKey]sa.Policy
}

// fileSA is a state from the file without its keys.
type fileSA struct {
	cfg  sa.Config // EncKey and IntegKey nil
	keys [sha256.Size]byte
}

// keyDigest hashes a state's keys with its identity, so that equal keys of
// different states do not show as equal digests in a core dump.
func keyDigest(c *sa.Config) [sha256.Size]byte {
	h := sha256.New()
	fmt.Fprintf(h, "espd-config-keys %d %s %s|", c.SPI, c.Dst, c.Suite)
	h.Write(c.EncKey)
	h.Write([]byte{'|'})
	h.Write(c.IntegKey)
	var d [sha256.Size]byte
	h.Sum(d[:0])
	return d
}

// Reload reads the configuration file again and applies the difference to
// what the previous file installed. An invalid file, or one that conflicts
// with states or policies installed through the control socket, is refused
// as a whole and nothing changes.
func (d *Daemon) Reload() error {
	if d.opts.ConfigPath == "" {
		return errors.New("no configuration file (--config) to reload")
	}
	data, err := os.ReadFile(d.opts.ConfigPath)
	if err != nil {
		return err
	}
	f, err := config.Parse(d.opts.ConfigPath, data)
	if err != nil {
		return err
	}
	defer zeroFileKeys(f)
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.applyLocked(f)
}

// zeroFileKeys wipes the key copies a parsed file holds once they are
// installed (sa.DB keeps its own copies).
func zeroFileKeys(f *config.File) {
	for i := range f.SAs {
		clear(f.SAs[i].EncKey)
		clear(f.SAs[i].IntegKey)
	}
}

// applyLocked makes the running state match f for everything the file
// owns. d.mu is held.
func (d *Daemon) applyLocked(f *config.File) error {
	next := fileState{sas: map[saKey]fileSA{}, policies: map[policyKey]sa.Policy{}}
	for i := range f.SAs {
		c := &f.SAs[i]
		k := saKey{c.SPI, c.Dst}
		if _, owned := d.file.sas[k]; !owned {
			if _, exists := d.db.GetSA(c.SPI, c.Dst); exists {
				return fmt.Errorf("%s: sa #%d (SPI 0x%08x to %s) is already installed through the control socket; delete it first", d.opts.ConfigPath, i+1, c.SPI, c.Dst)
			}
		}
		redacted := *c
		redacted.EncKey, redacted.IntegKey = nil, nil
		next.sas[k] = fileSA{cfg: redacted, keys: keyDigest(c)}
	}
	for i, p := range f.Policies {
		k := policyKey{p.Selector, p.Dir}
		if _, owned := d.file.policies[k]; !owned {
			if _, exists := d.db.GetPolicy(p.Selector, p.Dir); exists {
				return fmt.Errorf("%s: policy #%d (%s dir %s) is already installed through the control socket; delete it first", d.opts.ConfigPath, i+1, p.Selector, p.Dir)
			}
		}
		next.policies[k] = p
	}

	var errs []error
	// Policies first go away, so no traffic is routed to a state that is
	// about to disappear; states are then replaced; new policies last.
	for k, old := range d.file.policies {
		if p, keep := next.policies[k]; !keep || !samePolicy(old, p) {
			errs = append(errs, d.deletePolicyLocked(old.Selector, old.Dir))
		}
	}
	for k, old := range d.file.sas {
		n, keep := next.sas[k]
		if keep && n.keys == old.keys && n.cfg.Suite == old.cfg.Suite && n.cfg.Dir == old.cfg.Dir {
			continue
		}
		if err := d.db.DeleteSA(k.spi, k.dst); err != nil && !errors.Is(err, sa.ErrNotFound) {
			errs = append(errs, err)
		}
	}
	for i := range f.SAs {
		c := f.SAs[i]
		k := saKey{c.SPI, c.Dst}
		old, had := d.file.sas[k]
		_, live := d.db.GetSA(c.SPI, c.Dst)
		switch {
		case had && live && reflect.DeepEqual(old.cfg, next.sas[k].cfg):
			// unchanged
		case had && live:
			c.EncKey, c.IntegKey = nil, nil
			errs = append(errs, d.db.UpdateSA(c))
		default:
			if _, err := d.db.AddSA(c); err != nil {
				errs = append(errs, fmt.Errorf("sa #%d: %w", i+1, err))
			}
		}
	}
	for k, p := range next.policies {
		if old, had := d.file.policies[k]; had && samePolicy(old, p) {
			if _, live := d.db.GetPolicy(p.Selector, p.Dir); live {
				continue
			}
		}
		if _, err := d.addPolicyLocked(p); err != nil {
			errs = append(errs, fmt.Errorf("policy %s dir %s: %w", p.Selector, p.Dir, err))
		}
	}
	d.file = next
	return errors.Join(errs...)
}

// samePolicy compares policies ignoring the index the SPD assigns.
func samePolicy(a, b sa.Policy) bool {
	a.Index, b.Index = 0, 0
	return a == b
}
