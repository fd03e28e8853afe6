package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/global"
)

// A region's Redis is a region of global limits (global.Region): the parts
// (portion.lua) live under their keys' own hash tags, as every other
// limit's keys, so a take of a global rule and of the request's other
// rules stays one script call; the agent reads and sets them a key at a
// time, each on its own node's clock (shares.lua).

var sharesScript = rueidis.NewLuaScript(luaFile("lib") + luaFile("portion") + luaFile("shares"))

// Shares implements global.Region.
func (s *Store) Shares(ctx context.Context, rule string, l sluice.Limit, keys []string) ([]global.Share, error) {
	vals, err := s.shares(ctx, rule, l, keys, nil)
	if err != nil {
		return nil, err
	}
	out := make([]global.Share, len(keys))
	for i, k := range keys {
		out[i] = global.Share{Key: k, Share: vals[i][0], Lease: time.Duration(vals[i][1]) * time.Microsecond}
	}
	return out, nil
}

// SetShares implements global.Region.
func (s *Store) SetShares(ctx context.Context, rule string, l sluice.Limit, shares []global.Share) error {
	keys := make([]string, len(shares))
	for i, sh := range shares {
		if sh.Share > l.Portion && sh.Lease <= 0 {
			return fmt.Errorf("redis: rule %q: key %q: a share of %d above the own %d needs a lease", rule, sh.Key, sh.Share, l.Portion)
		}
		keys[i] = sh.Key
	}
	_, err := s.shares(ctx, rule, l, keys, shares)
	return err
}

// shares runs shares.lua for each key: a read, or the set of sets[i].
func (s *Store) shares(ctx context.Context, rule string, l sluice.Limit, keys []string, sets []global.Share) ([][2]int64, error) {
	if l.Portion <= 0 {
		return nil, fmt.Errorf("redis: rule %q: %v is not a region's part of a global limit", rule, l)
	}
	li, err := s.limits.info(l)
	if err != nil {
		return nil, fmt.Errorf("redis: rule %q: %w", rule, err)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	c := s.conn()
	if c == nil {
		return nil, s.notConnected()
	}
	now := ""
	if s.clock != nil {
		now = strconv.FormatInt(s.clock.Now()/1000, 10)
	}
	execs := make([]rueidis.LuaExec, len(keys))
	for i, k := range keys {
		share, lease := "", "0"
		if sets != nil {
			share = itoa(sets[i].Share)
			lease = itoa(max(int64(sets[i].Lease/time.Microsecond), 0)) // down: a lease ends no later than the agent counts
		}
		execs[i] = rueidis.LuaExec{Keys: []string{s.key(rule, k, li)},
			Args: []string{now, li.args[0], li.args[1], li.args[2], li.args[3], li.args[4], share, lease}}
	}
	out := make([][2]int64, len(keys))
	var errs []error
	for i, r := range sharesScript.ExecMulti(ctx, c, execs...) {
		v, err := r.AsIntSlice()
		if err == nil && len(v) != 2 {
			err = errors.New("shares.lua answered an unexpected shape")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("key %q: %w", keys[i], err))
			continue
		}
		out[i] = [2]int64{v[0], v[1]}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("redis: rule %q: %w", rule, err)
	}
	return out, nil
}
