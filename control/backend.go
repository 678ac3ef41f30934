package control

import (
	"context"
	"errors"
	"net/netip"

	"github.com/espd/espd/control/wire"
	"github.com/espd/espd/sa"
)

// Backend is what the Server calls to carry out requests. The daemon
// implements it over sa.DB (plus routes); its methods may be called from
// many connections at once and must not block for long.
//
// The code of an ERROR reply comes from the error returned: the Errno of a
// *wire.Error or a syscall.Errno in its chain; else ENOENT for sa.ErrNotFound,
// EEXIST for sa.ErrPolicyExists and sa.ErrStateExists, ENOSPC for
// sa.ErrNoSPI, ETIMEDOUT for context.DeadlineExceeded,
// and EINVAL for anything else (sa reports invalid configurations as plain
// errors). The error's text becomes the reply's message.
type Backend interface {
	// AddSA installs a state (SA_ADD). The server zeroes c's keys when
	// AddSA returns: keep copies (sa.DB.AddSA does).
	AddSA(c sa.Config) error
	// UpdateSA changes a state (SA_UPDATE), as sa.DB.UpdateSA: c is the
	// state's configuration from GetSA with the request's changes
	// applied; nil keys mean unchanged.
	UpdateSA(c sa.Config) error
	// DeleteSA removes the state (or SPI reservation) with this SPI and
	// outer destination (SA_DEL).
	DeleteSA(spi uint32, dst netip.Addr) error
	// GetSA returns a state without its keys (SA_GET).
	GetSA(spi uint32, dst netip.Addr) (wire.SAInfo, error)
	// ListSAs returns every state and SPI reservation (SA_LIST, STATS).
	ListSAs() ([]wire.SAInfo, error)
	// FlushSAs removes every state (SA_FLUSH).
	FlushSAs() error
	// AddPolicy installs a policy and returns it with its index
	// (POLICY_ADD).
	AddPolicy(p sa.Policy) (sa.Policy, error)
	// UpdatePolicy replaces the policy with p's selector, direction and
	// interface ID (POLICY_UPDATE).
	UpdatePolicy(p sa.Policy) (sa.Policy, error)
	// DeletePolicy removes the policy id names (POLICY_DEL).
	DeletePolicy(id sa.PolicyID) error
	// GetPolicy returns the policy id names (POLICY_GET).
	GetPolicy(id sa.PolicyID) (sa.Policy, error)
	// ListPolicies returns every policy (POLICY_LIST).
	ListPolicies() ([]sa.Policy, error)
	// FlushPolicies removes every policy (POLICY_FLUSH).
	FlushPolicies() error
	// AllocSPI reserves an unused inbound SPI in [lo, hi] (SPI_ALLOC).
	AllocSPI(lo, hi uint32) (uint32, error)
	// Stats returns the global counters (STATS): the SA database's and
	// the data path's.
	Stats() (wire.GlobalStats, error)
	// Subscribe starts an event stream buffering up to buffer events
	// (SUBSCRIBE). SubscribeDB adapts sa.DB.Subscribe.
	Subscribe(buffer int) (Subscription, error)
	// PairRole sets this node's role in its gateway pair when role is not
	// wire.PairRoleNone, and returns the pair's status after (PAIR_ROLE).
	// An espd not in a pair returns an error with EOPNOTSUPP.
	PairRole(role wire.PairRole) (wire.PairStatus, error)
}

// backendErrno classifies the errors of the sa package and of contexts.
func backendErrno(err error) wire.Errno {
	switch {
	case errors.Is(err, sa.ErrNotFound):
		return wire.ENOENT
	case errors.Is(err, sa.ErrPolicyExists), errors.Is(err, sa.ErrStateExists):
		return wire.EEXIST
	case errors.Is(err, sa.ErrNoSPI):
		return wire.ENOSPC
	case errors.Is(err, context.DeadlineExceeded):
		return wire.ETIMEDOUT
	}
	return wire.EINVAL
}
