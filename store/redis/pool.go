package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-rl/sluice/global"
)

// A region's Redis pools the demand of the region's processes for its
// agent (global.Pool): each process adds what its decisions were asked of
// a global rule's keys, in two hashes under the rule's tag, and the lead
// takes and empties them each tick. One key names the lead.

var (
	demandScript = rueidis.NewLuaScript(luaFile("demand"))
	leadScript   = rueidis.NewLuaScript(luaFile("lead"))
)

// maxPooledKeys bounds the keys a rule's pooled demand holds between two
// takes of the lead; a key past it keeps the share it has.
const maxPooledKeys = 50_000

// pooledFor is how long pooled demand lives without a lead to take it.
const pooledFor = 30 * time.Second

func (s *Store) demandKeys(rule string) []string {
	tag := s.prefix + "{g:" + hashTag(rule) + "}"
	return []string{tag + "da", tag + "ds"}
}

// AddDemand implements global.Pool.
func (s *Store) AddDemand(ctx context.Context, rule string, counts []global.Count) error {
	if len(counts) == 0 {
		return nil
	}
	c := s.conn()
	if c == nil {
		return s.notConnected()
	}
	args := make([]string, 0, 3+3*len(counts))
	args = append(args, "add", itoa(pooledFor.Milliseconds()), itoa(maxPooledKeys))
	for _, n := range counts {
		args = append(args, n.Key, itoa(n.Asked), itoa(n.Short))
	}
	if err := demandScript.Exec(ctx, c, s.demandKeys(rule), args).Error(); err != nil {
		return fmt.Errorf("redis: rule %q: pooling demand: %w", rule, err)
	}
	return nil
}

// TakeDemand implements global.Pool.
func (s *Store) TakeDemand(ctx context.Context, rule string) ([]global.Count, error) {
	c := s.conn()
	if c == nil {
		return nil, s.notConnected()
	}
	v, err := demandScript.Exec(ctx, c, s.demandKeys(rule), []string{"take"}).ToArray()
	if err == nil && len(v) != 2 {
		err = errors.New("demand.lua answered an unexpected shape")
	}
	if err != nil {
		return nil, fmt.Errorf("redis: rule %q: taking demand: %w", rule, err)
	}
	asked, err1 := pairs(v[0])
	short, err2 := pairs(v[1])
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("redis: rule %q: taking demand: %w", rule, err)
	}
	out := make([]global.Count, 0, len(asked))
	for k, a := range asked {
		out = append(out, global.Count{Key: k, Asked: a, Short: short[k]})
	}
	return out, nil
}

// pairs reads HGETALL's fields and whole-number values.
func pairs(m rueidis.RedisMessage) (map[string]int64, error) {
	l, err := m.AsStrSlice()
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(l)/2)
	for i := 0; i+1 < len(l); i += 2 {
		n, err := strconv.ParseInt(l[i+1], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("field %q: %w", l[i], err)
		}
		out[l[i]] = n
	}
	return out, nil
}

// Lead implements global.Pool.
func (s *Store) Lead(ctx context.Context, id string, ttl time.Duration) (bool, error) {
	c := s.conn()
	if c == nil {
		return false, s.notConnected()
	}
	n, err := leadScript.Exec(ctx, c, []string{s.prefix + "{g}lead"}, []string{id, itoa(max(ttl.Milliseconds(), 1))}).AsInt64()
	if err != nil {
		return false, fmt.Errorf("redis: region lead: %w", err)
	}
	return n == 1, nil
}
