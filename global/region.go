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
