package sluice

import (
	"fmt"
	"time"
)

// SyncMode says how the gateways that share a store share a rule's count.
// Every mode but SyncExact trades some exactness for fewer store calls; the
// table in docs/distributed.md gives each one's bound.
type SyncMode uint8

// The sync modes.
const (
	// SyncExact makes one atomic store call per decision: exact, the
	// default, and the only choice for money and security limits.
	SyncExact SyncMode = iota
	// SyncLease takes a batch of units from the store in one atomic call and
	// spends them locally, giving back what is left when the lease ends.
	// Never over-admits; under-admits by at most the units out on leases.
	SyncLease
	// SyncPeriodic counts locally and flushes the deltas to the store every
	// Interval, reading the global count back: over-admits by about
	// rate x interval x (gateways - 1).
	SyncPeriodic
	// SyncSplit enforces limit / N on each gateway with no store call, N
	// being the live gateways (or a configured number).
	SyncSplit
	// SyncLocal always counts in the gateway's embedded store, even when the
	// shared store is Redis: the loose per-node tier (a flood guard).
	SyncLocal
	// SyncAuto uses SyncLease for the rule's hot keys and SyncExact for the
	// rest.
	SyncAuto

	numSyncModes = iota
)

var syncModeNames = [numSyncModes]string{
	SyncExact:    "exact",
	SyncLease:    "lease",
	SyncPeriodic: "sync",
	SyncSplit:    "split",
	SyncLocal:    "local",
	SyncAuto:     "auto",
}

// String returns the mode's configuration name, such as "lease".
func (m SyncMode) String() string {
	if int(m) < len(syncModeNames) {
		return syncModeNames[m]
	}
	return fmt.Sprintf("SyncMode(%d)", uint8(m))
}

// ParseSyncMode returns the mode with the given configuration name.
func ParseSyncMode(name string) (SyncMode, error) {
	for i, n := range syncModeNames {
		if n == name {
			return SyncMode(i), nil
		}
	}
	return 0, fmt.Errorf("sluice: unknown sync mode %q (want exact, lease, sync, split, local or auto)", name)
}

// OverAdmits reports whether the mode can admit more than the limit across
// gateways: sync, split (if the gateway count is wrong) and local do.
func (m SyncMode) OverAdmits() bool {
	return m == SyncPeriodic || m == SyncSplit || m == SyncLocal
}

// Sharing is how one rule is shared among gateways (its `sync` setting).
type Sharing struct {
	Mode SyncMode
	// Batch is the largest lease (lease and auto; default 50). The batch
	// adapts below it: larger for a hot key, down to 1 near the limit.
	Batch int64
	// Interval is the flush period (sync; default 100 ms) or the lease's
	// time to live (lease and auto; default 1 s).
	Interval time.Duration
	// Shards splits each key's budget over this many sub-keys, each with
	// limit / Shards, so that one huge key spreads over Redis Cluster nodes
	// (exact and lease). 0 or 1: no split.
	Shards int
	// HotAbove is the decisions per second above which a key is hot (auto;
	// default 50).
	HotAbove int64
}

// Defaults of the sharing settings.
const (
	DefaultLeaseBatch   = 50
	DefaultLeaseTTL     = time.Second
	DefaultSyncInterval = 100 * time.Millisecond
	DefaultHotAbove     = 50
)

// WithDefaults returns s with its unset fields at their defaults.
func (s Sharing) WithDefaults() Sharing {
	if s.Batch <= 0 {
		s.Batch = DefaultLeaseBatch
	}
	if s.Interval <= 0 {
		s.Interval = DefaultLeaseTTL
		if s.Mode == SyncPeriodic {
			s.Interval = DefaultSyncInterval
		}
	}
	if s.HotAbove <= 0 {
		s.HotAbove = DefaultHotAbove
	}
	return s
}
