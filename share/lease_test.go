package share

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/memory"
)

// recording is a remote store that writes down the cost of every take it is
// asked for: a lease's batches, refunds (negative) and retries.
type recording struct {
	sluice.Store
	mu    sync.Mutex
	costs []int64
	keys  []string // the key of every take
	calls int      // the calls made
	empty int      // calls that carried no take
}

func (r *recording) Take(ctx context.Context, takes []sluice.Take, out []sluice.Decision) error {
	r.mu.Lock()
	for _, tk := range takes {
		r.costs = append(r.costs, tk.Cost)
		r.keys = append(r.keys, tk.Key)
	}
	r.calls++
	if len(takes) == 0 {
		r.empty++
	}
	r.mu.Unlock()
	return r.Store.Take(ctx, takes, out)
}

// since returns the costs asked for since the last call.
func (r *recording) since() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.costs
	r.costs = nil
	return c
}

// made returns the calls made, those that carried no take and the keys
// taken, since the last call.
func (r *recording) made() (calls, empty int, keys []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	calls, empty, keys = r.calls, r.empty, r.keys
	r.calls, r.empty, r.keys = 0, 0, nil
	return calls, empty, keys
}

// leaseFleet is n gateways leasing from one recording remote store on a
// manual clock, with no background work.
func leaseFleet(t *testing.T, n int, sh sluice.Sharing) (*sluice.ManualClock, *recording, []*Store) {
	clock := sluice.NewManualClock(epoch)
	remote := &recording{Store: memory.New(memory.WithClock(clock))}
	var gws []*Store
	for range n {
		g := New(remote, Options{
			Local: memory.New(memory.WithClock(clock)), Clock: clock, ManualTick: true,
			Sharing:  func(string) sluice.Sharing { return sh },
			Gateways: func() int { return n },
		})
		t.Cleanup(g.Close)
		gws = append(gws, g)
	}
	return clock, remote, gws
}

func leaseTake(t *testing.T, g *Store, lim sluice.Limit) sluice.Decision {
	t.Helper()
	var out [1]sluice.Decision
	if err := g.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: lim, Cost: 1}}, out[:]); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

// The batch policy, step by step on one gateway (limit 100 per hour, GCRA,
// so nothing refills within the test's seconds; batch at most 50; time to
// live 1 s): the first lease is a quarter of the burst (25); a lease spent
// before it expires doubles the next (50, the rule's batch); an expired
// lease with units left gives them back (a refund of 49) and halves the
// next (25). Each answer's Remaining is the store's plus the units held:
// the limit less what was admitted.
func TestLeaseBatchesGrowShrinkAndGoBack(t *testing.T) {
	lim := sluice.Limit{Rate: 100, Period: time.Hour}
	clock, remote, gws := leaseFleet(t, 1, sluice.Sharing{Mode: sluice.SyncLease, Batch: 50, Interval: time.Second})
	g := gws[0]
	admitted := int64(0)
	step := func(n int, wantCalls []int64) {
		t.Helper()
		for range n {
			d := leaseTake(t, g, lim)
			if !d.Allowed {
				t.Fatalf("take %d refused: %+v", admitted+1, d)
			}
			admitted++
			if d.Remaining != 100-admitted {
				t.Fatalf("take %d: remaining %d, want %d", admitted, d.Remaining, 100-admitted)
			}
		}
		if got := remote.since(); !slices.Equal(got, wantCalls) {
			t.Fatalf("after %d admitted: store calls %v, want %v", admitted, got, wantCalls)
		}
	}
	step(1, []int64{25})           // a quarter of the burst
	step(24, nil)                  // spent from the lease
	step(1, []int64{50})           // spent before it expired: doubled, up to the batch
	step(48, nil)                  // one unit left on the lease
	clock.Advance(2 * time.Second) // the lease expires with 1 unit
	step(1, []int64{-1, 25})       // given back, then a lease of half the batch
	if held := g.Stats().LeasedOut; held != 24 {
		t.Fatalf("%d units held, want 24", held)
	}
}

// Two gateways on one key of 100 per hour: each lease is at most half of
// what the store has left, so the leases shrink as the limit nears and the
// last units are leased one at a time; the gateway that took the last unit
// waits a while before asking again (here a quarter of the burst's
// refill, 25 x 36 s) rather than calling the store for every unit that
// refills; the other still finds the unit it needs; and the two together
// admit exactly the limit.
func TestLeasesShrinkNearTheLimitAndWaitForARefill(t *testing.T) {
	lim := sluice.Limit{Rate: 100, Period: time.Hour} // a unit refills every 36 s
	clock, remote, gws := leaseFleet(t, 2, sluice.Sharing{Mode: sluice.SyncLease, Batch: 50, Interval: time.Second})
	// Gateway 0 alone: batches of 12 (a quarter of the burst over 2
	// gateways), then doubled, each at most half of what remains.
	var calls []int64
	admitted := 0
	for range 99 {
		if !leaseTake(t, gws[0], lim).Allowed {
			t.Fatalf("gateway 0 refused after %d", admitted)
		}
		admitted++
		calls = append(calls, remote.since()...)
	}
	if want := []int64{12, 24, 32, 16, 8, 4, 2, 1}; !slices.Equal(calls, want) {
		t.Fatalf("gateway 0's leases %v, want %v", calls, want)
	}
	// It took the store down to 1 with a lease of 1 and spent it: it waits
	// 25 units' refill (900 s) before asking again, without a store call.
	d := leaseTake(t, gws[0], lim)
	if d.Allowed || d.RetryAfter != 900*time.Second || len(remote.since()) != 0 {
		t.Fatalf("gateway 0 at the limit: %+v, want refused for 900 s without a store call", d)
	}
	// Gateway 1 asks for its first lease (12), is refused, and takes the
	// one unit left.
	if d := leaseTake(t, gws[1], lim); !d.Allowed {
		t.Fatalf("gateway 1 refused the last unit: %+v", d)
	}
	admitted++
	if got := remote.since(); !slices.Equal(got, []int64{12, 1}) {
		t.Fatalf("gateway 1's calls %v, want [12 1]", got)
	}
	if d := leaseTake(t, gws[1], lim); d.Allowed || d.RetryAfter != 12*36*time.Second || len(remote.since()) != 0 {
		t.Fatalf("gateway 1 at the limit: %+v, want refused for its batch's refill (12 x 36 s) without a store call", d)
	}
	if admitted != 100 {
		t.Fatalf("admitted %d, want exactly 100", admitted)
	}
	// The wait ends to the nanosecond: then one store call, for one unit.
	clock.Advance(900*time.Second - time.Nanosecond)
	if d := leaseTake(t, gws[0], lim); d.Allowed || len(remote.since()) != 0 {
		t.Fatalf("gateway 0 a nanosecond before its wait ends: %+v", d)
	}
	clock.Advance(time.Nanosecond)
	if d := leaseTake(t, gws[0], lim); !d.Allowed {
		t.Fatalf("gateway 0 after its wait: %+v", d)
	}
	if got := remote.since(); !slices.Equal(got, []int64{1}) {
		t.Fatalf("gateway 0's call after its wait %v, want [1]", got)
	}
}

// A refund or a look at a leased key goes to the store as it is: a refund
// is not kept on this gateway's lease, where only this gateway could spend
// it, and a look consumes nothing.
func TestLeasedKeysRefundsAndLooksGoToTheStore(t *testing.T) {
	lim := sluice.Limit{Rate: 100, Period: time.Hour}
	_, remote, gws := leaseFleet(t, 1, sluice.Sharing{Mode: sluice.SyncLease, Batch: 50, Interval: time.Hour})
	g := gws[0]
	leaseTake(t, g, lim) // a lease of 25, 24 held
	remote.since()
	var out [1]sluice.Decision
	if err := g.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: lim, Cost: -1}}, out[:]); err != nil {
		t.Fatal(err)
	}
	if got := remote.since(); !slices.Equal(got, []int64{-1}) || g.Stats().LeasedOut != 24 {
		t.Fatalf("a refund of 1 on a leased key: store calls %v, %d held; want [-1] and the lease unchanged at 24", got, g.Stats().LeasedOut)
	}
	if err := g.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: lim}}, out[:]); err != nil {
		t.Fatal(err)
	}
	if got := remote.since(); !slices.Equal(got, []int64{0}) || out[0].Remaining != 76 {
		t.Fatalf("a look (cost 0) at a leased key: store calls %v, %+v; want it asked of the store (76 left there)", got, out[0])
	}
	if err := g.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: lim, Cost: 5, DryRun: true}}, out[:]); err != nil {
		t.Fatal(err)
	}
	if got := remote.since(); !slices.Equal(got, []int64{5}) || g.Stats().LeasedOut != 24 || !out[0].Allowed {
		t.Fatalf("a look at 5 on a leased key: store calls %v, %d held, %+v; want it asked of the store and the lease unchanged", got, g.Stats().LeasedOut, out[0])
	}
}

// A look at a split key in a request another rule refuses gives nothing
// back: it took nothing. (Were it undone, a key at its limit would be given
// a unit it never spent, and admit one more.)
func TestALookAtASplitKeyIsNotUndone(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	remote := memory.New(memory.WithClock(clock))
	g := New(remote, Options{
		Local: memory.New(memory.WithClock(clock)), Clock: clock, ManualTick: true, NoDenyCache: true,
		Sharing: func(rule string) sluice.Sharing {
			if rule == "split" {
				return sluice.Sharing{Mode: sluice.SyncSplit}
			}
			return sluice.Sharing{}
		},
	})
	defer g.Close()
	split := sluice.Limit{Rate: 2, Period: time.Hour}
	strict := sluice.Limit{Rate: 1, Period: time.Hour}
	take := func(takes ...sluice.Take) []sluice.Decision {
		out := make([]sluice.Decision, len(takes))
		if err := g.Take(context.Background(), takes, out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	// A split take in a request the other rule refuses is given back.
	take(sluice.Take{Rule: "strict", Key: "x", Limit: strict, Cost: 1})
	take(sluice.Take{Rule: "split", Key: "x", Limit: split, Cost: 1}, sluice.Take{Rule: "strict", Key: "x", Limit: strict, Cost: 1})
	if d := take(sluice.Take{Rule: "split", Key: "x", Limit: split, Cost: 2})[0]; !d.Allowed {
		t.Fatalf("a split unit taken for a refused request was kept: %+v", d)
	}
	take(sluice.Take{Rule: "split", Key: "k", Limit: split, Cost: 2})   // the split key at its limit
	take(sluice.Take{Rule: "strict", Key: "k", Limit: strict, Cost: 1}) // and the strict one
	take(sluice.Take{Rule: "split", Key: "k", Limit: split, Cost: 1, DryRun: true},
		sluice.Take{Rule: "strict", Key: "k", Limit: strict, Cost: 1}) // refused by strict
	if d := take(sluice.Take{Rule: "split", Key: "k", Limit: split, Cost: 1})[0]; d.Allowed {
		t.Fatalf("the split key at its limit admitted once more after a look at it was undone: %+v", d)
	}
}

// A lease's life on one gateway (limit 100 per hour, time to live 1 s):
// the tick gives an expired lease back at its expiry instant, and the next
// batch is half; a take at the expiry instant does the same; a key whose
// lease is empty and unused for a minute is forgotten, not before.
func TestLeaseExpiryAndIdleEdges(t *testing.T) {
	lim := sluice.Limit{Rate: 100, Period: time.Hour}
	clock, remote, gws := leaseFleet(t, 1, sluice.Sharing{Mode: sluice.SyncLease, Batch: 50, Interval: time.Second})
	g := gws[0]
	calls := func(want ...int64) {
		t.Helper()
		if got := remote.since(); !slices.Equal(got, want) {
			t.Fatalf("store calls %v, want %v", got, want)
		}
	}
	leaseTake(t, g, lim)
	calls(25)
	clock.Advance(time.Second) // the expiry instant
	g.Tick(context.Background())
	calls(-24) // given back
	leaseTake(t, g, lim)
	calls(12) // half the batch
	clock.Advance(time.Second)
	leaseTake(t, g, lim) // at the expiry instant: given back, then half again
	calls(-11, 6)
	g.Tick(context.Background())
	calls()
	clock.Advance(time.Minute) // a minute since the last take: the lease goes back, the key stays
	g.Tick(context.Background())
	calls(-5)
	if n := leaseCount(g); n != 1 {
		t.Fatalf("%d leases a minute after the last use, want 1 (forgotten only after a minute)", n)
	}
	clock.Advance(time.Nanosecond)
	g.Tick(context.Background())
	if n := leaseCount(g); n != 0 {
		t.Fatalf("%d leases after a minute unused and empty, want 0", n)
	}
}

func leaseCount(g *Store) int {
	g.leases.mu.Lock()
	defer g.leases.mu.Unlock()
	return len(g.leases.m)
}

// What a lease reports and asks for: the reset time counts down from the
// store's; a cost above the units held asks for a batch that covers it;
// past the bound on leases a key is decided exactly, one unit at a time;
// a lease the store refuses is retried with what the store has left.
func TestLeaseAnswersCostsBoundAndRetries(t *testing.T) {
	lim := sluice.Limit{Rate: 100, Period: time.Hour} // a unit per 36 s
	clock, remote, gws := leaseFleet(t, 1, sluice.Sharing{Mode: sluice.SyncLease, Batch: 50, Interval: time.Hour})
	g := gws[0]
	d := leaseTake(t, g, lim) // a lease of 25: the store full again in 25 x 36 s
	if d.ResetAfter != 15*time.Minute {
		t.Fatalf("reset after %v, want 15m", d.ResetAfter)
	}
	clock.Advance(time.Minute)
	if d := leaseTake(t, g, lim); d.ResetAfter != 14*time.Minute {
		t.Fatalf("a minute on, reset after %v, want 14m", d.ResetAfter)
	}
	remote.since()
	var out [1]sluice.Decision
	if err := g.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: lim, Cost: 30}}, out[:]); err != nil || !out[0].Allowed {
		t.Fatalf("a cost of 30 with 23 held: %+v %v", out[0], err)
	}
	if got := remote.since(); !slices.Equal(got, []int64{25}) || g.Stats().LeasedOut != 18 {
		t.Fatalf("a cost of 30 with 23 held: calls %v, %d held; want one batch of 25 and 18 held", got, g.Stats().LeasedOut)
	}

	// One lease at most: a second key is decided exactly.
	clock2 := sluice.NewManualClock(epoch)
	remote2 := &recording{Store: memory.New(memory.WithClock(clock2))}
	one := New(remote2, Options{Local: memory.New(memory.WithClock(clock2)), Clock: clock2, ManualTick: true, MaxEntries: 1,
		Sharing: func(string) sluice.Sharing { return sluice.Sharing{Mode: sluice.SyncLease, Batch: 50} }})
	defer one.Close()
	for _, key := range []string{"a", "b"} {
		if err := one.Take(context.Background(), []sluice.Take{{Rule: "r", Key: key, Limit: lim, Cost: 1}}, out[:]); err != nil {
			t.Fatal(err)
		}
	}
	if got := remote2.since(); !slices.Equal(got, []int64{25, 1}) {
		t.Fatalf("two keys, room for one lease: calls %v, want a lease of 25 then an exact take of 1", got)
	}

	// The store has 5 left; a lease of 25 is refused, and one of 5 taken.
	clock3 := sluice.NewManualClock(epoch)
	remote3 := &recording{Store: memory.New(memory.WithClock(clock3))}
	remote3.Store.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: lim, Cost: 95}}, out[:])
	g3 := New(remote3, Options{Local: memory.New(memory.WithClock(clock3)), Clock: clock3, ManualTick: true,
		Sharing: func(string) sluice.Sharing { return sluice.Sharing{Mode: sluice.SyncLease, Batch: 50} }})
	defer g3.Close()
	remote3.since()
	if d := leaseTake(t, g3, lim); !d.Allowed {
		t.Fatalf("5 left: %+v", d)
	}
	if got := remote3.since(); !slices.Equal(got, []int64{25, 5}) {
		t.Fatalf("5 left in the store: calls %v, want a lease of 25 refused, then one of 5", got)
	}
}

// A gateway whose lease grew large and which then finds the store empty
// (other gateways took the rest) waits for the refill of capacity / 2N
// units (N = 3 gateways: 16 units, 16 x 36 s), not of its whole batch (32
// units): what refills meanwhile stays under the burst, and the gateway is
// back as soon as a fair share is there. The refusal says so.
func TestARefusedBigLeaseWaitsForCapacityOverTwoN(t *testing.T) {
	lim := sluice.Limit{Rate: 100, Period: time.Hour} // a unit refills every 36 s
	_, remote, gws := leaseFleet(t, 3, sluice.Sharing{Mode: sluice.SyncLease, Batch: 50, Interval: time.Hour})
	for range 8 + 16 { // leases of 8 (a quarter of the burst over 3) and 16, spent before they expire
		if d := leaseTake(t, gws[0], lim); !d.Allowed {
			t.Fatalf("gateway 0 refused under the limit: %+v", d)
		}
	}
	// The other gateways take the rest.
	var out [1]sluice.Decision
	look := []sluice.Take{{Rule: "r", Key: "k", Limit: lim}}
	if err := remote.Store.Take(context.Background(), look, out[:]); err != nil {
		t.Fatal(err)
	}
	look[0].Cost = out[0].Remaining
	if err := remote.Store.Take(context.Background(), look, out[:]); err != nil || !out[0].Allowed || out[0].Remaining != 0 {
		t.Fatalf("the rest taken elsewhere: %+v, %v", out[0], err)
	}
	remote.since()
	le := gws[0].leases.get(&sluice.Take{Rule: "r", Key: "k"}, lim, 0)
	if le.units != 0 || le.batch != 16 || le.expires <= le.used {
		t.Fatalf("gateway 0's lease: %d units held, batch %d; want 0 and 16, spent before it expired (so 32 next)", le.units, le.batch)
	}
	d := leaseTake(t, gws[0], lim)
	if d.Allowed || d.RetryAfter != 16*36*time.Second {
		t.Fatalf("gateway 0 on an empty store: %+v, want refused for 16 units' refill (576 s)", d)
	}
	if calls := remote.since(); len(calls) == 0 || calls[len(calls)-1] != 1 {
		t.Fatalf("gateway 0's calls %v: want the last for the one unit it needs", calls)
	}
	if d := leaseTake(t, gws[0], lim); d.Allowed || d.RetryAfter != 16*36*time.Second || len(remote.since()) != 0 {
		t.Fatalf("gateway 0 asking again at once: %+v, want the same wait, without a store call", d)
	}
}
