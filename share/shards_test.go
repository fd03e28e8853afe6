package share

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/memory"
)

// shardedStore is one gateway whose rules are sharded as shards says
// (exact and unsharded otherwise), over a recording remote store.
func shardedStore(t *testing.T, shards map[string]int) (*sluice.ManualClock, *recording, *Store) {
	clock := sluice.NewManualClock(epoch)
	remote := &recording{Store: memory.New(memory.WithClock(clock))}
	g := New(remote, Options{
		Local: memory.New(memory.WithClock(clock)), Clock: clock, ManualTick: true, NoDenyCache: true,
		Sharing: func(rule string) sluice.Sharing { return sluice.Sharing{Shards: shards[rule]} },
	})
	t.Cleanup(g.Close)
	return clock, remote, g
}

// shardLeft reads what shard i of key has left under rule, from the remote
// store itself.
func shardLeft(t *testing.T, r *recording, rule, key string, l sluice.Limit, k, i int) int64 {
	t.Helper()
	var out [1]sluice.Decision
	if err := r.Store.Take(context.Background(), []sluice.Take{{Rule: rule, Key: shardKey(key, i), Limit: shardLimit(l, k)}}, out[:]); err != nil {
		t.Fatal(err)
	}
	return out[0].Remaining
}

func request(t *testing.T, g *Store, takes ...sluice.Take) []sluice.Decision {
	t.Helper()
	out := make([]sluice.Decision, len(takes))
	if err := g.Take(context.Background(), takes, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func allowed(ds []sluice.Decision) bool {
	for _, d := range ds {
		if !d.Allowed {
			return false
		}
	}
	return true
}

// A request of a plain rule and a sharded one stays all or nothing: when
// the sharded rule refuses, the plain rule's unit goes back; when the
// plain one refuses, the shards are only looked at, never taken from.
func TestShardedAndPlainRulesAreAllOrNothing(t *testing.T) {
	big := sluice.Limit{Rate: 8, Period: time.Hour} // 4 shards of 2
	_, remote, g := shardedStore(t, map[string]int{"big": 4})
	plain := sluice.Limit{Rate: 100, Period: time.Hour}
	both := func(p sluice.Limit) []sluice.Decision {
		return request(t, g, sluice.Take{Rule: "plain", Key: "t", Limit: p, Cost: 1}, sluice.Take{Rule: "big", Key: "t", Limit: big, Cost: 1})
	}
	for i := range 8 {
		if !allowed(both(plain)) {
			t.Fatalf("request %d refused within both limits", i+1)
		}
	}
	if allowed(both(plain)) {
		t.Fatal("a 9th request passed a sharded limit of 8")
	}
	var peek [1]sluice.Decision
	remote.Store.Take(context.Background(), []sluice.Take{{Rule: "plain", Key: "t", Limit: plain}}, peek[:])
	if peek[0].Remaining != 92 {
		t.Fatalf("the plain rule has %d left after 8 admitted requests, want 92: the refused request's unit was kept", peek[0].Remaining)
	}
	// Now the plain rule refuses (a limit of 8, all used): the sharded
	// rule, with room again after a refund, is not charged.
	request(t, g, sluice.Take{Rule: "big", Key: "t", Limit: big, Cost: -2})
	small := sluice.Limit{Rate: 8, Period: time.Hour}
	request(t, g, sluice.Take{Rule: "plain", Key: "u", Limit: small, Cost: 8})
	ds := request(t, g, sluice.Take{Rule: "plain", Key: "u", Limit: small, Cost: 1}, sluice.Take{Rule: "big", Key: "t", Limit: big, Cost: 1})
	if allowed(ds) || ds[0].Allowed {
		t.Fatalf("the plain rule at its limit did not refuse: %+v", ds)
	}
	var left int64
	for i := range 4 {
		left += shardLeft(t, remote, "big", "t", big, 4, i)
	}
	if left != 2 {
		t.Fatalf("the shards have %d left, want 2: a request the plain rule refused was charged to them", left)
	}
}

// Two sharded rules: when the second refuses, the unit the first took from
// one of its shards goes back to that shard, whichever shard it was (a
// has three shards, so that successive requests start on each).
func TestASecondShardedRuleRefusingGivesTheFirstsUnitBack(t *testing.T) {
	a := sluice.Limit{Rate: 6, Period: time.Hour} // 3 shards of 2
	b := sluice.Limit{Rate: 2, Period: time.Hour} // 2 shards of 1
	_, remote, g := shardedStore(t, map[string]int{"a": 3, "b": 2})
	req := func() []sluice.Decision {
		return request(t, g, sluice.Take{Rule: "a", Key: "k", Limit: a, Cost: 1}, sluice.Take{Rule: "b", Key: "k", Limit: b, Cost: 1})
	}
	aLeft := func() (n int64) {
		for i := range 3 {
			n += shardLeft(t, remote, "a", "k", a, 3, i)
		}
		return n
	}
	for range 2 {
		if !allowed(req()) {
			t.Fatal("refused within both limits")
		}
	}
	for range 6 {
		if allowed(req()) {
			t.Fatal("a request passed b's limit of 2")
		}
		if left := aLeft(); left != 4 {
			t.Fatalf("a's shards have %d left after 2 admitted requests, want 4: a refused request kept a's unit", left)
		}
	}
}

// Looking at a sharded key (a dry run) sums its shards' remaining units and
// admits only if one shard alone could take the cost; a refund goes to the
// first shard; a take refused by every shard answers the soonest retry of
// them; a cost above one shard's burst is refused at once as too large.
func TestShardedPeeksRefundsRetriesAndTooLarge(t *testing.T) {
	l := sluice.Limit{Rate: 8, Period: time.Hour} // 4 shards of 2, a unit per 30 min each
	clock, remote, g := shardedStore(t, map[string]int{"r": 4})
	shardTake := func(i int, cost int64) {
		var out [1]sluice.Decision
		remote.Store.Take(context.Background(), []sluice.Take{{Rule: "r", Key: shardKey("k", i), Limit: shardLimit(l, 4), Cost: cost}}, out[:])
	}
	// Shards 0-2 with 1 left, shard 3 with 2.
	for i := range 3 {
		shardTake(i, 1)
	}
	d := request(t, g, sluice.Take{Rule: "r", Key: "k", Limit: l, Cost: 2, DryRun: true})[0]
	if !d.Allowed || d.Remaining != 5 {
		t.Fatalf("a look at cost 2 with one shard of 2: %+v, want allowed, 5 remaining", d)
	}
	shardTake(3, 1)
	d = request(t, g, sluice.Take{Rule: "r", Key: "k", Limit: l, Cost: 2, DryRun: true})[0]
	if d.Allowed || d.Remaining != 4 {
		t.Fatalf("a look at cost 2 with every shard at 1: %+v, want refused (no shard can take 2), 4 remaining", d)
	}
	remote.since()
	request(t, g, sluice.Take{Rule: "r", Key: "k", Limit: l, Cost: -1})
	if got := shardLeft(t, remote, "r", "k", l, 4, 0); got != 2 {
		t.Fatalf("shard 0 has %d after a refund of 1, want 2", got)
	}
	// Empty every shard, shard 2 first, then 10 minutes later the others:
	// shard 2 refills first, in 20 minutes.
	shardTake(2, 1)
	clock.Advance(10 * time.Minute)
	for _, i := range []int{0, 0, 1, 3} {
		shardTake(i, 1)
	}
	for range 4 { // from every starting shard
		d = request(t, g, sluice.Take{Rule: "r", Key: "k", Limit: l, Cost: 1})[0]
		if d.Allowed || d.RetryAfter != 20*time.Minute {
			t.Fatalf("every shard empty: %+v, want refused, retry after 20m (the soonest shard)", d)
		}
	}
	remote.since()
	d = request(t, g, sluice.Take{Rule: "r", Key: "k", Limit: l, Cost: 3})[0]
	if d.Allowed || d.Reason != sluice.ReasonTooLarge {
		t.Fatalf("a cost of 3 on shards of 2: %+v, want refused as too large", d)
	}
	if calls := remote.since(); !slices.Equal(calls, []int64{3}) {
		t.Fatalf("a cost too large for any shard asked the store %v, want one call", calls)
	}
}

// Successive takes start at successive shards, so that one key's traffic
// spreads over them; a look (cost 0) sums them all.
func TestShardedTakesSpreadAndALookSumsThem(t *testing.T) {
	l := sluice.Limit{Rate: 8, Period: time.Hour} // 4 shards of 2
	_, remote, g := shardedStore(t, map[string]int{"r": 4})
	for range 4 {
		if !request(t, g, sluice.Take{Rule: "r", Key: "k", Limit: l, Cost: 1})[0].Allowed {
			t.Fatal("refused")
		}
	}
	for i := range 4 {
		if left := shardLeft(t, remote, "r", "k", l, 4, i); left != 1 {
			t.Fatalf("after 4 takes, shard %d has %d left, want 1 each: the takes did not spread", i, left)
		}
	}
	if d := request(t, g, sluice.Take{Rule: "r", Key: "k", Limit: l})[0]; !d.Allowed || d.Remaining != 4 {
		t.Fatalf("a look: %+v, want 4 remaining over the shards", d)
	}
}

// failing is a remote store that is down.
type failing struct{}

func (failing) Take(context.Context, []sluice.Take, []sluice.Decision) error {
	return errors.New("down")
}

// A store that fails is a failed take, whatever the rules' modes: never a
// decision made of empty answers.
func TestAFailingStoreIsAnError(t *testing.T) {
	for name, shards := range map[string]int{"plain": 0, "sharded": 4} {
		g := New(failing{}, Options{Local: memory.New(), ManualTick: true,
			Sharing: func(string) sluice.Sharing { return sluice.Sharing{Shards: shards} }})
		out := make([]sluice.Decision, 1)
		if err := g.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: sluice.Limit{Rate: 8, Period: time.Hour}, Cost: 1}}, out); err == nil {
			t.Errorf("%s: a take on a failing store returned no error: %+v", name, out[0])
		}
		g.Close()
	}
}

// Each store call is a round trip: none carries no take. A request of
// sharded takes only makes no call for its (absent) plain ones; a refused
// request whose admitted takes took nothing (a look) gives nothing back;
// one shard is no sharding: the key is the rule's own, not a sub-key.
func TestNoStoreCallCarriesNoTake(t *testing.T) {
	lim := sluice.Limit{Rate: 4, Period: time.Hour}
	_, r, g := shardedStore(t, map[string]int{"s": 2, "one": 1})

	if ds := request(t, g, sluice.Take{Rule: "s", Key: "k", Limit: lim, Cost: 1}); !allowed(ds) {
		t.Fatalf("a sharded take under its limit: %+v", ds)
	}
	if calls, empty, _ := r.made(); calls != 1 || empty != 0 {
		t.Fatalf("one sharded take admitted by its first shard: %d calls, %d empty; want 1 call", calls, empty)
	}

	// A look at a plain rule and a sharded take too large for any shard: the
	// look took nothing, so there is nothing to give back.
	ds := request(t, g, sluice.Take{Rule: "p", Key: "k", Limit: lim}, sluice.Take{Rule: "s", Key: "k", Limit: lim, Cost: 3})
	if ds[1].Allowed {
		t.Fatalf("3 units from shards of 2: %+v", ds[1])
	}
	calls, empty, keys := r.made()
	if empty != 0 || calls != 2 {
		t.Fatalf("a look and a refused sharded take: %d calls (%d empty), keys %q; want 2 (the look, one shard), no give-back", calls, empty, keys)
	}

	ds = request(t, g, sluice.Take{Rule: "one", Key: "k", Limit: lim, Cost: 1})
	if _, _, keys := r.made(); !allowed(ds) || !slices.Equal(keys, []string{"k"}) {
		t.Fatalf("a rule of one shard took from %q (allowed %v), want the key itself", keys, allowed(ds))
	}
}
