package control

import (
	"fmt"
	"net/netip"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/sa"
)

// dbBackend is the Backend the tests serve: a real sa.DB.
type dbBackend struct{ db *sa.DB }

// AddSA relies on backendErrno to map sa.ErrStateExists to EEXIST, as
// the daemon's Backend does.
func (b dbBackend) AddSA(c sa.Config) error {
	_, err := b.db.AddSA(c)
	return err
}

func (b dbBackend) UpdateSA(c sa.Config) error { return b.db.UpdateSA(c) }

func (b dbBackend) DeleteSA(spi uint32, dst netip.Addr) error { return b.db.DeleteSA(spi, dst) }

func (b dbBackend) GetSA(spi uint32, dst netip.Addr) (wire.SAInfo, error) {
	s, ok := b.db.GetSA(spi, dst)
	if !ok {
		return wire.SAInfo{}, fmt.Errorf("state spi 0x%08x dst %v: %w", spi, dst, sa.ErrNotFound)
	}
	return wire.InfoOf(s), nil
}

func (b dbBackend) ListSAs() ([]wire.SAInfo, error) {
	var out []wire.SAInfo
	for _, s := range b.db.SAs() {
		out = append(out, wire.InfoOf(s))
	}
	return out, nil
}

func (b dbBackend) FlushSAs() error { b.db.FlushSAs(); return nil }

func (b dbBackend) AddPolicy(p sa.Policy) (sa.Policy, error) { return b.db.AddPolicy(p) }

func (b dbBackend) UpdatePolicy(p sa.Policy) (sa.Policy, error) { return b.db.UpdatePolicy(p) }

func (b dbBackend) DeletePolicy(id sa.PolicyID) error {
	return b.db.DeletePolicy(id)
}

func (b dbBackend) GetPolicy(id sa.PolicyID) (sa.Policy, error) {
	p, ok := b.db.GetPolicy(id)
	if !ok {
		return sa.Policy{}, fmt.Errorf("policy %v: %w", id, sa.ErrNotFound)
	}
	return p, nil
}

func (b dbBackend) ListPolicies() ([]sa.Policy, error) { return b.db.Policies(), nil }

func (b dbBackend) FlushPolicies() error { b.db.FlushPolicies(); return nil }

func (b dbBackend) AllocSPI(lo, hi uint32) (uint32, error) { return b.db.AllocSPI(lo, hi) }

func (b dbBackend) Stats() (wire.GlobalStats, error) {
	return wire.GlobalStats{GlobalStats: b.db.Stats()}, nil
}

func (b dbBackend) Subscribe(buffer int) (Subscription, error) { return SubscribeDB(b.db, buffer), nil }

// PairRole answers as an espd that is not one of a gateway pair.
func (b dbBackend) PairRole(wire.PairRole) (wire.PairStatus, error) {
	return wire.PairStatus{}, wire.Errorf(wire.EOPNOTSUPP, "not one of a gateway pair")
}
