package share

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/memory"
)

// sync mode, step by step on two gateways (limit 10 per hour, nothing
// refills within the test; interval 100 ms). Each gateway reads the
// store's count once, then admits while its own pending count fits in what
// the store had; after the interval it sends its pending count as one take,
// and what the store cannot hold is sent as far as it fits. Between syncs
// the gateways pass the limit by what the others admit in one interval.
func TestSyncCountsLocallyAndSendsEachInterval(t *testing.T) {
	lim := sluice.Limit{Rate: 10, Period: time.Hour}
	clock, remote, gws := leaseFleet(t, 2, sluice.Sharing{Mode: sluice.SyncPeriodic, Interval: 100 * time.Millisecond})
	take := func(g int, want bool, remaining int64, retry time.Duration, calls ...int64) {
		t.Helper()
		d := leaseTake(t, gws[g], lim)
		if d.Allowed != want || d.Remaining != remaining || (!want && d.RetryAfter != retry) {
			t.Fatalf("gateway %d: %+v, want allowed %v, remaining %d, retry after %v", g, d, want, remaining, retry)
		}
		if got := remote.since(); !slices.Equal(got, calls) {
			t.Fatalf("gateway %d: store calls %v, want %v", g, got, calls)
		}
	}
	// At 0: each reads the store's 10 (a take of 0) and counts locally.
	take(0, true, 9, 0, 0)
	for r := int64(8); r >= 4; r-- {
		take(0, true, r, 0)
	}
	take(0, true, 3, 0) // 7 on gateway 0
	take(1, true, 9, 0, 0)
	for r := int64(8); r >= 4; r-- {
		take(1, true, r, 0)
	} // 6 on gateway 1
	// At 99 ms, gateway 1 fills what it read and is refused until its next
	// sync, 1 ms away, without a store call.
	clock.Advance(99 * time.Millisecond)
	for r := int64(3); r >= 0; r-- {
		take(1, true, r, 0)
	} // 10 on gateway 1
	take(1, false, 0, time.Millisecond)
	// At 100 ms (the interval, to the nanosecond): gateway 0 sends its 7,
	// reads 3 left, and admits from them.
	clock.Advance(time.Millisecond)
	take(0, true, 2, 0, 7)
	// Gateway 1's tick sends its 10; the store holds 3 of them and the rest
	// was admitted over the limit.
	gws[1].Tick(t.Context())
	if got := remote.since(); !slices.Equal(got, []int64{10, 3}) {
		t.Fatalf("gateway 1's flush: store calls %v, want [10 3]", got)
	}
	take(1, false, 0, 100*time.Millisecond)
	// A tick before the interval sends nothing; one after it sends gateway
	// 0's pending unit (the store is full: nothing fits).
	clock.Advance(99 * time.Millisecond)
	gws[0].Tick(t.Context())
	if got := remote.since(); len(got) != 0 {
		t.Fatalf("a tick before the interval called the store: %v", got)
	}
	clock.Advance(time.Millisecond)
	gws[0].Tick(t.Context())
	if got := remote.since(); !slices.Equal(got, []int64{1}) {
		t.Fatalf("gateway 0's flush: store calls %v, want [1]", got)
	}
	// Keys unused for a minute with nothing pending are forgotten.
	clock.Advance(time.Minute)
	gws[0].Tick(t.Context())
	gws[1].Tick(t.Context())
	for i, g := range gws {
		g.counts.mu.Lock()
		n := len(g.counts.m)
		g.counts.mu.Unlock()
		if n != 0 {
			t.Errorf("gateway %d still counts %d keys unused for over a minute", i, n)
		}
	}
	if got := remote.since(); len(got) != 0 {
		t.Fatalf("forgetting idle keys called the store: %v", got)
	}
}

// A cost above the limit is too large, one at the limit only limited;
// past the bound on counted keys a key is decided exactly; an idle key is
// forgotten after a minute, not at it.
func TestSyncEdges(t *testing.T) {
	lim := sluice.Limit{Rate: 10, Period: time.Hour}
	clock := sluice.NewManualClock(epoch)
	remote := &recording{Store: memory.New(memory.WithClock(clock))}
	g := New(remote, Options{Local: memory.New(memory.WithClock(clock)), Clock: clock, ManualTick: true, MaxEntries: 1,
		Sharing: func(string) sluice.Sharing { return sluice.Sharing{Mode: sluice.SyncPeriodic, Interval: time.Second} }})
	defer g.Close()
	take := func(key string, cost int64) sluice.Decision {
		var out [1]sluice.Decision
		if err := g.Take(context.Background(), []sluice.Take{{Rule: "r", Key: key, Limit: lim, Cost: cost}}, out[:]); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	take("a", 1)
	if d := take("a", 10); d.Allowed || d.Reason != sluice.ReasonLimited {
		t.Fatalf("a cost of the whole limit with 1 pending: %+v, want limited", d)
	}
	if d := take("a", 11); d.Allowed || d.Reason != sluice.ReasonTooLarge || d.RetryAfter != time.Millisecond {
		t.Fatalf("a cost above the limit: %+v, want too large (retry: the least there is)", d)
	}
	remote.since()
	take("b", 1) // no room for a second count: exact
	if got := remote.since(); !slices.Equal(got, []int64{1}) {
		t.Fatalf("a second key with room for one: calls %v, want an exact take of 1", got)
	}
	clock.Advance(time.Second)
	g.Tick(context.Background()) // a's pending unit sent
	clock.Advance(time.Minute - time.Second)
	g.Tick(context.Background())
	g.counts.mu.Lock()
	n := len(g.counts.m)
	g.counts.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d counted keys a minute after the last use, want 1", n)
	}
	clock.Advance(time.Nanosecond)
	g.Tick(context.Background())
	g.counts.mu.Lock()
	n = len(g.counts.m)
	g.counts.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d counted keys after a minute unused, want 0", n)
	}
}
