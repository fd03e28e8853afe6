package memory

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/global"
)

// checkShares refuses a share above the region's own without a lease: it
// would never end.
func checkShares(rule string, l sluice.Limit, shares []global.Share) error {
	for _, sh := range shares {
		if sh.Share > l.Portion && sh.Lease <= 0 {
			return fmt.Errorf("memory: rule %q: key %q: a share of %d above the own %d needs a lease", rule, sh.Key, sh.Share, l.Portion)
		}
	}
	return nil
}

// The embedded store is a region of global limits (global.Region): a
// region of one process, whose parts the process's own agent moves.

// portionTable returns the table of a global limit's parts.
func (s *Store) portionTable(rule string, l sluice.Limit) (*table[portionCell, *portionCell], error) {
	if l.Portion <= 0 {
		return nil, fmt.Errorf("memory: rule %q: %v is not a region's part of a global limit", rule, l)
	}
	t, err := s.table(rule, l)
	if err != nil {
		return nil, err
	}
	return t.(*table[portionCell, *portionCell]), nil
}

// Shares implements global.Region.
func (s *Store) Shares(_ context.Context, rule string, l sluice.Limit, keys []string) ([]global.Share, error) {
	t, err := s.portionTable(rule, l)
	if err != nil {
		return nil, err
	}
	now := s.clock.Now()
	out := make([]global.Share, len(keys))
	for i, k := range keys {
		out[i] = global.Share{Key: k, Share: l.Portion}
		t.with(k, now, func(c *portionCell) {
			out[i].Share = c.s.Share(now)
			if out[i].Share > c.s.Own && c.s.Until != 0 {
				out[i].Lease = time.Duration(c.s.Until - now)
			}
		})
	}
	return out, nil
}

// SetShares implements global.Region.
func (s *Store) SetShares(_ context.Context, rule string, l sluice.Limit, shares []global.Share) error {
	t, err := s.portionTable(rule, l)
	if err != nil {
		return err
	}
	if err := checkShares(rule, l, shares); err != nil {
		return err
	}
	now := s.clock.Now()
	for _, sh := range shares {
		until := int64(0)
		if sh.Lease > 0 {
			until = now + int64(sh.Lease)
		}
		if over := t.with(sh.Key, now, func(c *portionCell) { c.s = c.s.Set(&t.params, now, sh.Share, until) }); over {
			return fmt.Errorf("memory: rule %q: key %q not kept on its own (the store's key bound is reached): its share is not moved", rule, sh.Key)
		}
	}
	return nil
}
