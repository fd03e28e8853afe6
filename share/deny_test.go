package share

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/memory"
)

// The deny cache, step by step (limit 2 per hour, GCRA: a unit every 30
// minutes): a refusal is answered from the cache, for the same or a larger
// cost, its Retry-After and reset counting down, until the instant the
// store said to retry; a look (cost 0) and a smaller cost are asked of the
// store; with room for two entries, a third refusal is not cached until an
// entry has expired.
func TestDenyCacheAnswersUntilTheRetryInstant(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	remote := &recording{Store: memory.New(memory.WithClock(clock))}
	g := New(remote, Options{Local: memory.New(memory.WithClock(clock)), Clock: clock, ManualTick: true, MaxEntries: 2})
	defer g.Close()
	lim := sluice.Limit{Rate: 2, Period: time.Hour}
	take := func(key string, cost int64) sluice.Decision {
		t.Helper()
		var out [1]sluice.Decision
		if err := g.Take(context.Background(), []sluice.Take{{Rule: "r", Key: key, Limit: lim, Cost: cost}}, out[:]); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	calls := func(want ...int64) {
		t.Helper()
		if got := remote.since(); !slices.Equal(got, want) {
			t.Fatalf("store calls %v, want %v", got, want)
		}
	}
	take("a", 2)
	first := take("a", 2) // refused by the store: retry in 60 min
	calls(2, 2)
	if first.Allowed || first.RetryAfter != time.Hour {
		t.Fatalf("the store's refusal: %+v", first)
	}
	clock.Advance(10 * time.Minute)
	d := take("a", 2)
	calls() // from the cache
	if d.Allowed || d.RetryAfter != 50*time.Minute || d.ResetAfter != first.ResetAfter-10*time.Minute || d.Remaining != first.Remaining {
		t.Fatalf("the cached refusal 10 minutes on: %+v, want retry after 50m, reset after %v, remaining %d", d, first.ResetAfter-10*time.Minute, first.Remaining)
	}
	take("a", 3) // a larger cost: refused from the cache too
	calls()
	// To the nanosecond: cached before the retry instant, asked at it.
	clock.Advance(50*time.Minute - time.Nanosecond)
	take("a", 2)
	calls()
	clock.Advance(time.Nanosecond)
	if d := take("a", 2); !d.Allowed {
		t.Fatalf("at the retry instant: %+v", d)
	}
	calls(2)
	// A smaller cost may fit, and a look (cost 0) takes nothing: both are
	// asked of the store.
	take("a", 2)
	take("a", 1)
	take("a", 0)
	calls(2, 1, 0)
	// Two entries at most: a's refusal (of 1) and b's are cached, c's and
	// d's are not while those live.
	for _, k := range []string{"b", "c", "d"} {
		take(k, 2)
		take(k, 1)
	}
	remote.since()
	take("a", 1)
	take("b", 1)
	calls()
	take("c", 1)
	take("d", 1)
	calls(1, 1)
	// Once they have expired, a new refusal makes room for itself.
	clock.Advance(31 * time.Minute)
	take("d", 1) // admitted: a unit refilled
	take("d", 1) // refused: cached, the expired entries swept
	take("d", 1)
	calls(1, 1)
}

// The deny cache is bounded: a refusal with no wait (it would answer
// nothing) takes no entry, and at the bound an entry whose retry instant
// has come is swept to make room, to the nanosecond.
func TestDenyCacheKeepsOnlyEntriesThatAnswer(t *testing.T) {
	c := newDenyCache(1)
	now := epoch.UnixNano()
	tk := func(key string) *sluice.Take {
		return &sluice.Take{Rule: "r", Key: key, Limit: sluice.Limit{Rate: 2, Period: time.Hour}, Cost: 1}
	}
	c.learn(tk("a"), &sluice.Decision{Reason: sluice.ReasonLimited}, now)
	if len(c.m) != 0 {
		t.Fatalf("a refusal with no wait was kept: %d entries", len(c.m))
	}
	c.learn(tk("a"), &sluice.Decision{Reason: sluice.ReasonLimited, RetryAfter: time.Second}, now)
	now += int64(time.Second) // a's retry instant: a answers nothing now
	c.learn(tk("b"), &sluice.Decision{Reason: sluice.ReasonLimited, RetryAfter: time.Second}, now)
	if _, hit := c.check(tk("b"), now); !hit {
		t.Fatalf("at the bound, b was not kept though a's entry had come to its retry instant (%d entries)", len(c.m))
	}
}
