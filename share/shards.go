package share

import (
	"context"
	"strconv"
	"sync/atomic"

	"github.com/sluice-rl/sluice"
)

// One huge key (a tenant with a contract of 10,000 per second) would send
// all its traffic to the one Redis Cluster node that owns its hash slot.
// With shards: K, the key's budget is split over K sub-keys, "<key>\x1f<i>",
// each in a slot of its own, each with limit / K (rounded down, so the
// shards never add up to more than the limit). A take tries the shards in
// turn from a rotating start and is refused only when every shard refuses:
// never more than the limit in all, at the price of refusing when the units
// left are spread thinner than the cost over the shards.

// shardKey names sub-key i of key.
func shardKey(key string, i int) string { return key + "\x1f" + strconv.Itoa(i) }

// rotor spreads the starting shard of successive takes.
var rotor atomic.Uint64

// remoteTakes makes the remote call for the exact takes of one request:
// the unsharded ones in one atomic call, then each sharded one; if a
// sharded take is refused after the rest were admitted, what was taken is
// given back, so the request stays all or nothing. No call carries no take:
// each is a round trip to the store.
func (s *Store) remoteTakes(ctx context.Context, takes []sluice.Take, decs []sluice.Decision, plans []plan, idx []int) error {
	var pbuf, sbuf [8]int
	plain, sharded := pbuf[:0], sbuf[:0]
	for j := range takes {
		if k := plans[idx[j]].sh.Shards; k > 1 {
			sharded = append(sharded, j)
		} else {
			plain = append(plain, j)
		}
	}
	if len(sharded) == 0 {
		return s.call(ctx, takes, decs)
	}
	allowed := true
	if len(plain) > 0 {
		pt := make([]sluice.Take, len(plain))
		pd := make([]sluice.Decision, len(plain))
		for n, j := range plain {
			pt[n] = takes[j]
		}
		if err := s.call(ctx, pt, pd); err != nil {
			return err
		}
		for n, j := range plain {
			decs[j] = pd[n]
			allowed = allowed && pd[n].Allowed
		}
	}
	taken := make([]int, len(takes)) // the shard each sharded take took units from, plus one; 0 for none
	for _, j := range sharded {
		tk := takes[j]
		if !allowed {
			tk.DryRun = true // report only
		}
		d, used, err := s.shardTake(ctx, &tk, plans[idx[j]].sh.Shards)
		if err != nil {
			s.giveBackRemote(ctx, takes, decs, plain, sharded, taken, plans, idx)
			return err
		}
		decs[j], taken[j] = d, used
		if !d.Allowed && allowed {
			allowed = false
			s.giveBackRemote(ctx, takes, decs, plain, sharded, taken, plans, idx)
		}
	}
	return nil
}

// giveBackRemote refunds the admitted takes of a request that a later take
// refused.
func (s *Store) giveBackRemote(ctx context.Context, takes []sluice.Take, decs []sluice.Decision, plain, sharded, taken []int, plans []plan, idx []int) {
	var back []sluice.Take
	for _, j := range plain {
		if decs[j].Allowed && takes[j].Cost > 0 && !takes[j].DryRun {
			tk := takes[j]
			tk.Cost = -tk.Cost
			back = append(back, tk)
		}
	}
	for _, j := range sharded {
		if taken[j] > 0 {
			tk := takes[j]
			k := plans[idx[j]].sh.Shards
			tk.Key, tk.Limit, tk.Cost = shardKey(tk.Key, taken[j]-1), shardLimit(tk.Limit, k), -tk.Cost
			back = append(back, tk)
			taken[j] = 0
		}
	}
	if len(back) > 0 {
		s.call(ctx, back, make([]sluice.Decision, len(back)))
	}
}

// shardTake takes from the shards of one key, trying each in turn from a
// rotating start. Peeks, dry runs and refunds see every shard in one call
// (a refund goes to the first shard). It returns, beside the decision, the
// shard that units were taken from plus one: 0 when none were.
func (s *Store) shardTake(ctx context.Context, tk *sluice.Take, k int) (sluice.Decision, int, error) {
	l := shardLimit(tk.Limit, k)
	if tk.Cost <= 0 || tk.DryRun {
		all := make([]sluice.Take, k)
		outs := make([]sluice.Decision, k)
		for i := range all {
			all[i] = sluice.Take{Rule: tk.Rule, Key: shardKey(tk.Key, i), Limit: l}
		}
		all[0].Cost = min(tk.Cost, 0) // a refund; a peek or dry run takes nothing
		if err := s.call(ctx, all, outs); err != nil {
			return sluice.Decision{}, 0, err
		}
		d := sluice.Decision{Allowed: true, Rule: tk.Rule, Limit: tk.Limit}
		for _, o := range outs {
			d.Remaining += o.Remaining
			d.ResetAfter = max(d.ResetAfter, o.ResetAfter)
		}
		if tk.Cost > 0 && !anyFits(outs, tk.Cost) {
			d.Allowed, d.Reason = false, sluice.ReasonLimited
		}
		return d, 0, nil
	}
	start := int(rotor.Add(1) % uint64(k))
	var best sluice.Decision
	for n := range k {
		i := (start + n) % k
		one := [1]sluice.Take{{Rule: tk.Rule, Key: shardKey(tk.Key, i), Limit: l, Cost: tk.Cost}}
		var out [1]sluice.Decision
		if err := s.call(ctx, one[:], out[:]); err != nil {
			return sluice.Decision{}, 0, err
		}
		if out[0].Allowed {
			return out[0], i + 1, nil
		}
		if out[0].Reason == sluice.ReasonTooLarge {
			return out[0], 0, nil // no shard can ever take it
		}
		if n == 0 || out[0].RetryAfter < best.RetryAfter {
			best = out[0]
		}
	}
	return best, 0, nil
}

func anyFits(outs []sluice.Decision, cost int64) bool {
	for _, o := range outs {
		if o.Remaining >= cost {
			return true
		}
	}
	return false
}

// shardLimit is one shard's part of l among k.
func shardLimit(l sluice.Limit, k int) sluice.Limit { return l.Share(k) }
