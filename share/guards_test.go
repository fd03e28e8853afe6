package share

import (
	"context"
	"testing"
	"time"
	"unsafe"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/memory"
)

// The guards of the sharing layer against over-admission and leakage
// between clients, each shown by a test that fails without it.

// A caller may build its key in a buffer it reuses (the engine does): the
// deny cache must keep a copy. Were it to keep the caller's bytes, the
// refusal of one key would move to whatever key the buffer holds next, and
// a client who never sent a request would be refused.
func TestDenyCacheKeepsItsOwnCopyOfTheKey(t *testing.T) {
	lim := sluice.Limit{Rate: 1, Period: time.Hour}
	f := newFleet(t, 1, sluice.Sharing{})
	buf := []byte("victim-1")
	key := unsafe.String(&buf[0], len(buf))
	f.take(t, 0, "r", key, lim, 1)
	if f.take(t, 0, "r", key, lim, 1).Allowed {
		t.Fatal("the second take of a limit of 1 was admitted")
	}
	copy(buf, "bystand2") // the buffer now holds another key
	calls := f.calls()
	if f.take(t, 0, "r", "victim-1", lim, 1).Allowed {
		t.Fatal("the refused key was admitted")
	}
	if f.calls() != calls {
		t.Fatal("the refused key's cached refusal was lost when the caller's buffer changed: the deny cache kept the caller's bytes")
	}
	if d := f.take(t, 0, "r", "bystand2", lim, 1); !d.Allowed {
		t.Fatalf("a key never seen before was refused (%v)", d.Reason)
	}
}

// A lease never takes more than the store's remaining units divided by the
// gateways sharing them: one hot gateway cannot take a window's whole limit
// and starve the others.
func TestLeaseTakesAtMostItsShareOfWhatRemains(t *testing.T) {
	const gateways = 3
	lim := sluice.Limit{Rate: 120, Period: time.Hour}
	f := newFleet(t, gateways, sluice.Sharing{Mode: sluice.SyncLease, Batch: 100, Interval: time.Hour})
	peek := func() int64 {
		var out [1]sluice.Decision
		f.remote.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: lim}}, out[:])
		return out[0].Remaining
	}
	for i := range 100 {
		before := peek()
		if !f.take(t, 0, "r", "k", lim, 1).Allowed {
			break
		}
		held := f.gws[0].Stats().LeasedOut
		if grew := before - peek(); grew > 0 && grew > max(1, before/gateways) {
			t.Fatalf("take %d: a lease of %d units with %d remaining among %d gateways (held now %d)", i+1, grew, before, gateways, held)
		}
	}
	// The others still find units in the store.
	if !f.take(t, 1, "r", "k", lim, 1).Allowed {
		t.Fatal("a second gateway found nothing left: the first leased it all")
	}
}

// The periodic tick gives an expired lease's units back to the store, so
// units one gateway stopped needing serve the others.
func TestTickGivesBackExpiredLeases(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	remote := memory.New(memory.WithClock(clock))
	g := New(remote, Options{
		Local: memory.New(memory.WithClock(clock)), Clock: clock, ManualTick: true,
		Sharing: func(string) sluice.Sharing {
			return sluice.Sharing{Mode: sluice.SyncLease, Batch: 50, Interval: time.Second}
		},
		Gateways: func() int { return 1 },
	})
	defer g.Close()
	lim := sluice.Limit{Rate: 100, Period: time.Hour}
	var out [1]sluice.Decision
	if err := g.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: lim, Cost: 1}}, out[:]); err != nil || !out[0].Allowed {
		t.Fatalf("%v %v", out[0], err)
	}
	held := g.Stats().LeasedOut
	if held == 0 {
		t.Fatal("nothing leased")
	}
	clock.Advance(2 * time.Second) // past the lease's time to live
	g.Tick(context.Background())
	if got := g.Stats().LeasedOut; got != 0 {
		t.Fatalf("%d units still held after the tick past the lease's expiry", got)
	}
	remote.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: lim}}, out[:])
	if out[0].Remaining != 99 {
		t.Fatalf("the store has %d after the tick, want 99 (1 spent, %d given back)", out[0].Remaining, held)
	}
}

// A lease spent to its last unit has nothing to give back when it
// expires: the tick makes no store call for it, and its next batch is not
// halved as an unspent lease's is.
func TestTickLeavesASpentLeaseAlone(t *testing.T) {
	lim := sluice.Limit{Rate: 100, Period: time.Hour}
	clock, remote, gws := leaseFleet(t, 1, sluice.Sharing{Mode: sluice.SyncLease, Batch: 50, Interval: time.Second})
	for range 25 { // the first lease, a quarter of the burst, spent
		leaseTake(t, gws[0], lim)
	}
	remote.since()
	clock.Advance(2 * time.Second)
	gws[0].Tick(context.Background())
	if calls := remote.since(); len(calls) != 0 {
		t.Fatalf("the tick after a spent lease expired called the store for %v", calls)
	}
	le := gws[0].leases.get(&sluice.Take{Rule: "r", Key: "k"}, lim, 0)
	if le.batch != 25 {
		t.Fatalf("a spent lease's batch after its expiry: %d, want 25 (not halved)", le.batch)
	}
}
