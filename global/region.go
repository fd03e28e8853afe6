package global

import (
	"context"
	"time"

	"github.com/sluice-rl/sluice"
)

// Share is a key's share in a region's store: the share in force and, for
// a share above the region's own, how long its lease has left (Region's
// Shares) or is to last from when the store applies it (SetShares).
// Leases travel as durations, never as instants: each store counts them on
// its own clock, which need not agree with the agent's or another node's.
type Share struct {
	Key   string
	Share int64 // thousandths
	Lease time.Duration
}

// Region is a region's store as its agent reads and moves the shares of a
// global limit's keys (parts: sluice.Limit.Portion). The embedded store
// and the Redis store are regions.
type Region interface {
	// Shares reads keys' parts of the limit l of rule; a key the store has
	// not seen holds its own share.
	Shares(ctx context.Context, rule string, l sluice.Limit, keys []string) ([]Share, error)
	// SetShares sets keys' shares, each part settled at the share in
	// force first (algo.Portion.Set). A key whose share the store cannot
	// keep on its own (the embedded store's key bound reached) is an error,
	// and the agent then tells the coordinator nothing it did not apply.
	SetShares(ctx context.Context, rule string, l sluice.Limit, shares []Share) error
}

// Pool is a region's store shared by several processes: each pools the
// demand its decisions counted, and one of them, the lead, takes it all
// and runs the region's agent. A store without Pool (the embedded store)
// is a region of one process, which is its own lead.
type Pool interface {
	// AddDemand adds a process's demand for rule's keys to the region's.
	AddDemand(ctx context.Context, rule string, counts []Count) error
	// TakeDemand takes the region's demand for rule since the last take.
	TakeDemand(ctx context.Context, rule string) ([]Count, error)
	// Lead reports whether the process id leads the region's agent for
	// the next ttl: it takes the lead when nobody holds it, and keeps it
	// while it asks again within ttl.
	Lead(ctx context.Context, id string, ttl time.Duration) (bool, error)
}

// Home is the store where the coordinator's accounts of global rules live,
// reached by every region (a Redis: store/redis Store.Exchange).
type Home interface {
	// Exchange runs region's exchange for rule's asks as one atomic step
	// on the home's clock: a grant for each ask, in order, and keys the
	// region did not ask about that other regions want more of.
	Exchange(ctx context.Context, rule, region string, o *Options, asks []Ask) ([]Grant, []string, error)
}
