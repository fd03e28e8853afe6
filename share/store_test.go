package share

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/memory"
)

var epoch = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

// fleet is n gateways, each with its own Store and embedded store, sharing
// one "remote" store (an embedded store here: the modes' arithmetic does not
// depend on what the shared store is) on one manual clock.
type fleet struct {
	clock  *sluice.ManualClock
	remote *memory.Store
	gws    []*Store
}

func newFleet(t *testing.T, n int, sh sluice.Sharing) *fleet {
	f := &fleet{clock: sluice.NewManualClock(epoch)}
	f.remote = memory.New(memory.WithClock(f.clock))
	for range n {
		g := New(f.remote, Options{
			Local:    memory.New(memory.WithClock(f.clock)),
			Sharing:  func(string) sluice.Sharing { return sh },
			Gateways: func() int { return n },
			Clock:    f.clock,
		})
		t.Cleanup(g.Close)
		f.gws = append(f.gws, g)
	}
	return f
}

func (f *fleet) take(t *testing.T, g int, rule, key string, l sluice.Limit, cost int64) sluice.Decision {
	t.Helper()
	var out [1]sluice.Decision
	if err := f.gws[g].Take(context.Background(), []sluice.Take{{Rule: rule, Key: key, Limit: l, Cost: cost}}, out[:]); err != nil {
		t.Fatal(err)
	}
	return out[0]
}

func (f *fleet) calls() (n uint64) {
	for _, g := range f.gws {
		n += g.Stats().RemoteCalls
	}
	return n
}

// Leases never admit more than the limit, and make far fewer store calls.
func TestLeaseNeverOverAdmitsAndSavesCalls(t *testing.T) {
	lim := sluice.Limit{Rate: 1000, Period: time.Hour}
	f := newFleet(t, 3, sluice.Sharing{Mode: sluice.SyncLease, Batch: 50})
	admitted := 0
	for i := range 3000 {
		if f.take(t, i%3, "r", "hot", lim, 1).Allowed {
			admitted++
		}
	}
	if admitted > 1000 {
		t.Fatalf("lease admitted %d on a limit of 1000", admitted)
	}
	if admitted < 1000-3*50 {
		t.Fatalf("lease admitted %d: more stranded than the units out on leases (at most 150)", admitted)
	}
	if calls := f.calls(); calls*10 > uint64(admitted) {
		t.Fatalf("%d store calls for %d admissions: want at least 10x fewer", calls, admitted)
	}
	// Expired leases go back: the store gets every unspent unit.
	f.clock.Advance(2 * time.Second)
	for _, g := range f.gws {
		g.leases.expire(context.Background(), f.clock.Now(), false)
	}
	var peek [1]sluice.Decision
	f.remote.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "hot", Limit: lim}}, peek[:])
	var held int64
	for _, g := range f.gws {
		held += g.Stats().LeasedOut
	}
	if held != 0 {
		t.Fatalf("%d units still held after the leases expired", held)
	}
	// Admitted plus the store's remaining is the limit plus what refilled
	// in the 2 s (1000 per hour: 0 whole units).
	if got := int64(admitted) + peek[0].Remaining; got != 1000 {
		t.Fatalf("admitted %d + remaining %d = %d: units were lost or made", admitted, peek[0].Remaining, got)
	}
}

// steady runs 3 gateways for 30 s of simulated time, perMs requests each
// millisecond spread over them, on a hot key of 100 per second.
func steady(t *testing.T, sh sluice.Sharing, every time.Duration) (admitted, requests int, calls uint64) {
	lim := sluice.Limit{Rate: 100, Period: time.Second, Burst: 100}
	f := newFleet(t, 3, sh)
	const seconds = 30
	for step := 0; step < seconds*int(time.Second/every); step++ {
		f.clock.Advance(every)
		requests++
		if f.take(t, step%3, "r", "k", lim, 1).Allowed {
			admitted++
		}
		if step%50 == 0 {
			for _, g := range f.gws {
				g.leases.expire(context.Background(), f.clock.Now(), false)
			}
		}
	}
	return admitted, requests, f.calls()
}

// A hot key below its limit (80 of 100 per second): the lease admits every
// request, with at least 10x fewer store calls than exact.
func TestLeaseOnAHotKeyBelowItsLimit(t *testing.T) {
	admitted, requests, calls := steady(t, sluice.Sharing{Mode: sluice.SyncLease, Batch: 50}, 12500*time.Microsecond)
	_, _, exactCalls := steady(t, sluice.Sharing{}, 12500*time.Microsecond)
	if admitted != requests {
		t.Fatalf("admitted %d of %d under the limit", admitted, requests)
	}
	if calls*10 > exactCalls {
		t.Fatalf("lease made %d store calls, exact %d: want at least 10x fewer", calls, exactCalls)
	}
	t.Logf("below the limit: %d requests, all admitted; lease %d store calls, exact %d (%.0fx fewer)", requests, calls, exactCalls, float64(exactCalls)/float64(calls))
}

// A hot key held at its limit (1,000 requests per second against 100): the
// lease never admits more than exact, under-admits by at most 2%, and still
// makes fewer store calls than exact with its deny cache.
func TestLeaseOnAHotKeyAtItsLimit(t *testing.T) {
	admitted, requests, calls := steady(t, sluice.Sharing{Mode: sluice.SyncLease, Batch: 50}, time.Millisecond)
	exactAdmitted, _, exactCalls := steady(t, sluice.Sharing{}, time.Millisecond)
	if admitted > exactAdmitted {
		t.Fatalf("lease admitted %d, more than exact's %d", admitted, exactAdmitted)
	}
	if under := float64(exactAdmitted-admitted) / float64(exactAdmitted); under > 0.02 {
		t.Fatalf("lease admitted %d of exact's %d: %.1f%% under, want at most 2%%", admitted, exactAdmitted, 100*under)
	}
	if calls >= exactCalls {
		t.Fatalf("lease made %d store calls, exact %d", calls, exactCalls)
	}
	t.Logf("at the limit: %d requests, exact admitted %d with %d calls, lease %d with %d calls (%.1fx fewer; %.0fx fewer than one per request)",
		requests, exactAdmitted, exactCalls, admitted, calls, float64(exactCalls)/float64(calls), float64(requests)/float64(calls))
}

// Close gives back every unit held on leases.
func TestCloseGivesBackLeases(t *testing.T) {
	lim := sluice.Limit{Rate: 100, Period: time.Hour}
	f := newFleet(t, 1, sluice.Sharing{Mode: sluice.SyncLease, Batch: 50})
	for range 3 {
		f.take(t, 0, "r", "k", lim, 1)
	}
	if f.gws[0].Stats().LeasedOut == 0 {
		t.Fatal("no units were leased")
	}
	f.gws[0].Close()
	var peek [1]sluice.Decision
	f.remote.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: lim}}, peek[:])
	if peek[0].Remaining != 97 {
		t.Fatalf("after Close the store has %d, want 97", peek[0].Remaining)
	}
}

// A lease on a fixed window ends with its window: units leased in one
// window are never spent in the next.
func TestLeaseOnAFixedWindowEndsWithTheWindow(t *testing.T) {
	lim := sluice.Limit{Rate: 100, Period: time.Minute, Algorithm: sluice.FixedWindow}
	f := newFleet(t, 1, sluice.Sharing{Mode: sluice.SyncLease, Batch: 50, Interval: time.Hour})
	f.clock.Set(epoch.Add(59*time.Second + 900*time.Millisecond))
	f.take(t, 0, "r", "k", lim, 1) // leases units in this window
	f.clock.Set(epoch.Add(61 * time.Second))
	// The next window has 100 for everyone; this gateway must not add the
	// previous window's leftovers.
	admitted := 0
	for range 300 {
		if f.take(t, 0, "r", "k", lim, 1).Allowed {
			admitted++
		}
	}
	if admitted > 100 {
		t.Fatalf("admitted %d in one window of 100", admitted)
	}
}

// The deny cache answers a refused key without a store call until its
// retry time, and a refund clears it.
func TestDenyCacheSparesStoreCalls(t *testing.T) {
	lim := sluice.Limit{Rate: 2, Period: time.Minute}
	f := newFleet(t, 1, sluice.Sharing{})
	f.take(t, 0, "r", "k", lim, 1)
	f.take(t, 0, "r", "k", lim, 1)
	refused := f.take(t, 0, "r", "k", lim, 1)
	if refused.Allowed {
		t.Fatal("third admitted")
	}
	calls := f.calls()
	for range 100 {
		if d := f.take(t, 0, "r", "k", lim, 1); d.Allowed || d.RetryAfter <= 0 {
			t.Fatalf("cached refusal: %+v", d)
		}
	}
	if f.calls() != calls {
		t.Fatalf("%d store calls for 100 cached refusals", f.calls()-calls)
	}
	f.clock.Advance(refused.RetryAfter)
	if !f.take(t, 0, "r", "k", lim, 1).Allowed {
		t.Fatal("not admitted at the retry time")
	}
	// A refund drops the entry at once.
	f.take(t, 0, "r", "k", lim, 1)
	f.take(t, 0, "r", "k", lim, -1)
	if !f.take(t, 0, "r", "k", lim, 1).Allowed {
		t.Fatal("refused after a refund: the deny cache kept a stale entry")
	}
}

// Split gives each gateway limit / N; local gives each the whole limit;
// neither calls the store.
func TestSplitAndLocal(t *testing.T) {
	lim := sluice.Limit{Rate: 90, Period: time.Hour}
	for _, tc := range []struct {
		mode sluice.SyncMode
		each int
	}{{sluice.SyncSplit, 30}, {sluice.SyncLocal, 90}} {
		f := newFleet(t, 3, sluice.Sharing{Mode: tc.mode})
		for g := range 3 {
			n := 0
			for range 200 {
				if f.take(t, g, "r", "k", lim, 1).Allowed {
					n++
				}
			}
			if n != tc.each {
				t.Fatalf("%v: gateway %d admitted %d, want %d", tc.mode, g, n, tc.each)
			}
		}
		if f.calls() != 0 {
			t.Fatalf("%v made %d store calls", tc.mode, f.calls())
		}
	}
}

// sync counts locally and calls the store at most once per interval per
// key; its over-admission stays within rate x interval x (gateways - 1) plus
// what each gateway admits before its first sync reads the count.
func TestSyncBoundsOverAdmission(t *testing.T) {
	lim := sluice.Limit{Rate: 100, Period: time.Second, Burst: 100}
	f := newFleet(t, 3, sluice.Sharing{Mode: sluice.SyncPeriodic, Interval: 100 * time.Millisecond})
	admitted := 0
	const seconds = 10
	for step := range seconds * 1000 {
		f.clock.Advance(time.Millisecond)
		if f.take(t, step%3, "r", "k", lim, 1).Allowed {
			admitted++
		}
		if step%100 == 0 {
			for _, g := range f.gws {
				g.counts.flush(context.Background(), f.clock.Now(), false)
			}
		}
	}
	exact := 100 + 100*seconds
	bound := exact + int(100*0.1*2*seconds*10)/10 + 2*100 // rate x interval x (N-1) per interval, plus two bursts seen before the first sync
	if admitted > bound {
		t.Fatalf("sync admitted %d, over its bound %d (exact %d)", admitted, bound, exact)
	}
	if calls := f.calls(); calls > uint64(3*seconds*10*2+10) {
		t.Fatalf("%d store calls: more than about one per key per interval per gateway", calls)
	}
	t.Logf("sync: admitted %d against exact %d (%.1f%% over), %d store calls", admitted, exact, 100*float64(admitted-exact)/float64(exact), f.calls())
}

// Shards never add up to more than the limit, and spread one key over
// several store keys.
func TestShardsSpreadAKeyWithinItsLimit(t *testing.T) {
	lim := sluice.Limit{Rate: 100, Period: time.Hour}
	f := newFleet(t, 2, sluice.Sharing{Shards: 4})
	admitted := 0
	for i := range 300 {
		if f.take(t, i%2, "r", "tenant", lim, 1).Allowed {
			admitted++
		}
	}
	if admitted != 100 {
		t.Fatalf("4 shards of 25 admitted %d, want 100", admitted)
	}
	used := 0
	for i := range 4 {
		var peek [1]sluice.Decision
		f.remote.Take(context.Background(), []sluice.Take{{Rule: "r", Key: shardKey("tenant", i), Limit: shardLimit(lim, 4)}}, peek[:])
		if peek[0].Remaining == 0 {
			used++
		}
	}
	if used != 4 {
		t.Fatalf("%d of 4 shards used", used)
	}
}

// A call's takes stay all or nothing across modes: a lease rule's units
// come back when an exact rule of the same request refuses.
func TestMixedModesAreAllOrNothing(t *testing.T) {
	f := &fleet{clock: sluice.NewManualClock(epoch)}
	f.remote = memory.New(memory.WithClock(f.clock))
	g := New(f.remote, Options{
		Local: memory.New(memory.WithClock(f.clock)), Clock: f.clock,
		Sharing: func(rule string) sluice.Sharing {
			if rule == "leased" {
				return sluice.Sharing{Mode: sluice.SyncLease}
			}
			return sluice.Sharing{}
		},
	})
	defer g.Close()
	f.gws = []*Store{g}
	loose := sluice.Limit{Rate: 100, Period: time.Hour}
	tight := sluice.Limit{Rate: 1, Period: time.Hour}
	takes := []sluice.Take{{Rule: "leased", Key: "u", Limit: loose, Cost: 1}, {Rule: "exact", Key: "u", Limit: tight, Cost: 1}}
	out := make([]sluice.Decision, 2)
	g.Take(context.Background(), takes, out)
	if !out[0].Allowed || !out[1].Allowed {
		t.Fatalf("first: %+v", out)
	}
	held := g.Stats().LeasedOut
	for range 5 {
		g.Take(context.Background(), takes, out)
		if out[1].Allowed {
			t.Fatal("tight rule admitted twice")
		}
	}
	if got := g.Stats().LeasedOut; got != held {
		t.Fatalf("refused requests consumed leased units: %d held, was %d", got, held)
	}
}

// auto leases a rule's hot keys and keeps its cold keys exact.
func TestAutoLeasesHotKeysOnly(t *testing.T) {
	lim := sluice.Limit{Rate: 100000, Period: time.Hour}
	f := newFleet(t, 1, sluice.Sharing{Mode: sluice.SyncAuto, HotAbove: 20})
	for i := range 2000 { // 2,000 decisions in 1 s on one key: hot
		f.clock.Advance(500 * time.Microsecond)
		f.take(t, 0, "r", "hot", lim, 1)
		if i%100 == 0 {
			f.take(t, 0, "r", fmt.Sprint("cold-", i), lim, 1)
		}
	}
	if held := f.gws[0].Stats().LeasedOut; held == 0 {
		t.Fatal("the hot key was not leased")
	}
	if calls := f.calls(); calls > 200 {
		t.Fatalf("%d store calls for 2,000 hot decisions", calls)
	}
	top := f.gws[0].Hot.Top(5, 20, f.clock.Now())
	if len(top) == 0 || top[0].Key != "hot" {
		t.Fatalf("hot keys: %+v", top)
	}
}

// A lower tier refused at its floor says nothing of the tiers above it:
// the deny cache does not learn from it, and a higher tier is decided by
// the store.
func TestDenyCacheLearnsNothingFromAFloor(t *testing.T) {
	lim := sluice.Limit{Rate: 10, Period: time.Hour}
	f := newFleet(t, 1, sluice.Sharing{})
	take := func(floor int64) sluice.Decision {
		var out [1]sluice.Decision
		if err := f.gws[0].Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: lim, Cost: 1, Floor: floor}}, out[:]); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	low := 0
	for range 10 {
		if take(5).Allowed {
			low++
		}
	}
	if low != 5 {
		t.Fatalf("the low tier took %d above a floor of 5", low)
	}
	if d := take(0); !d.Allowed {
		t.Fatalf("the top tier after the low tier's refusals: %+v, want admitted (the share kept for it)", d)
	}
}

// A call of exact takes costs no allocation: the copies of its takes go to
// the remote store in pooled scratch, which would otherwise escape through
// the store's interface on every call.
func TestExactTakesDoNotAllocate(t *testing.T) {
	f := newFleet(t, 1, sluice.Sharing{Mode: sluice.SyncExact})
	lim := sluice.Limit{Rate: 1 << 40, Period: time.Hour * 24 * 365}
	takes := []sluice.Take{
		{Rule: "a", Key: "user-1", Limit: lim, Cost: 1},
		{Rule: "b", Key: "user-1", Limit: lim, Cost: 1},
	}
	var out [2]sluice.Decision
	ctx := context.Background()
	if n := testing.AllocsPerRun(1000, func() {
		if err := f.gws[0].Take(ctx, takes, out[:]); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("%v allocations per call of two exact takes, want 0", n)
	}
	if !out[0].Allowed || !out[1].Allowed || out[0].Rule != "a" || out[1].Rule != "b" {
		t.Errorf("decisions = %+v", out)
	}
}

// A region's share is what the answer names: a gateway enforcing half of a
// limit says so (its RateLimit fields and the JSON API advertise it), in
// every mode.
func TestARegionsShareIsTheLimitAnswered(t *testing.T) {
	for _, mode := range []sluice.SyncMode{sluice.SyncExact, sluice.SyncLease, sluice.SyncPeriodic, sluice.SyncSplit, sluice.SyncLocal} {
		clock := sluice.NewManualClock(epoch)
		remote := memory.New(memory.WithClock(clock))
		g := New(remote, Options{
			Local: memory.New(memory.WithClock(clock)), Clock: clock,
			Sharing: func(string) sluice.Sharing { return sluice.Sharing{Mode: mode} },
			Scale:   func(string) float64 { return 0.5 }, Gateways: func() int { return 1 },
		})
		l := sluice.Limit{Rate: 300, Period: time.Hour}
		admitted := 0
		var last sluice.Decision
		for range 400 {
			var out [1]sluice.Decision
			if err := g.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: l, Cost: 1}}, out[:]); err != nil {
				t.Fatal(err)
			}
			if out[0].Allowed {
				admitted++
			}
			last = out[0]
		}
		g.Close()
		if admitted != 150 || last.Limit.Rate != 150 {
			t.Errorf("%s: admitted %d of a half share of 300, answering a limit of %d; want 150 and 150", mode, admitted, last.Limit.Rate)
		}
	}
}

// A pooled scratch keeps a slice a big request grew, up to maxScratch
// entries: a request of thousands of takes (outside input) does not pin
// thousands of entries in the pool.
func TestAPooledScratchKeepsAtMostMaxScratch(t *testing.T) {
	for _, tc := range []struct {
		grown, kept int
	}{{maxScratch, maxScratch}, {maxScratch + 1, 8}} {
		sc := &scratch{takes: make([]sluice.Take, 0, 8), decs: make([]sluice.Decision, 0, 8)}
		sc.grown(make([]sluice.Take, 0, tc.grown), make([]sluice.Decision, 0, tc.grown))
		if cap(sc.takes) != tc.kept || cap(sc.decs) != tc.kept {
			t.Fatalf("a scratch of 8 after a request grew to %d: keeps %d takes and %d decisions, want %d", tc.grown, cap(sc.takes), cap(sc.decs), tc.kept)
		}
	}
}

// sync: auto leases a key from the decision at which its rate reaches
// HotAbove, not one later.
func TestAutoLeasesAtExactlyHotAbove(t *testing.T) {
	f := newFleet(t, 1, sluice.Sharing{Mode: sluice.SyncAuto, HotAbove: 3})
	tk := sluice.Take{Rule: "r", Key: "k", Limit: sluice.Limit{Rate: 100, Period: time.Hour}, Cost: 1}
	now := &instant{clock: f.clock}
	for i, want := range []sluice.SyncMode{sluice.SyncExact, sluice.SyncExact, sluice.SyncLease} {
		if p := f.gws[0].plan(&tk, now); p.mode != want {
			t.Fatalf("decision %d in one second with HotAbove 3: mode %v, want %v", i+1, p.mode, want)
		}
	}
}

// Rules outside sync: auto are sampled one decision in hotSample for the
// hot-key list, each sample counting hotSample: the rate listed is the
// rate seen, give or take the sampling's noise.
func TestHotKeysOfOtherRulesAreSampledAtTheirRate(t *testing.T) {
	f := newFleet(t, 1, sluice.Sharing{Mode: sluice.SyncExact})
	lim := sluice.Limit{Rate: 10_000, Period: time.Hour}
	for range 800 { // 800 decisions in the same second
		f.take(t, 0, "r", "k", lim, 1)
	}
	// The count is hotSample x Binomial(800, 1/hotSample): 800 on average,
	// with a standard deviation of 75; 400 and 1,600 are more than 5 away.
	top := f.gws[0].Hot.Top(1, 0, f.clock.Now())
	if len(top) != 1 || top[0].Key != "k" || top[0].Rate < 400 || top[0].Rate > 1600 {
		t.Fatalf("800 decisions of one key in a second: hot list %+v, want k at about 800/s", top)
	}
}

// A look at a split or local rule's key is answered from this gateway's
// count, like its takes: it makes no store call.
func TestALookAtALocalRuleStaysLocal(t *testing.T) {
	for _, mode := range []sluice.SyncMode{sluice.SyncSplit, sluice.SyncLocal} {
		f := newFleet(t, 2, sluice.Sharing{Mode: mode})
		lim := sluice.Limit{Rate: 10, Period: time.Hour}
		f.take(t, 0, "r", "k", lim, 3)
		var out [1]sluice.Decision
		if err := f.gws[0].Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: lim, Cost: 1, DryRun: true}}, out[:]); err != nil {
			t.Fatal(err)
		}
		if f.calls() != 0 || !out[0].Allowed {
			t.Fatalf("%v: a look made %d store calls (answer %+v), want none", mode, f.calls(), out[0])
		}
	}
}

// countingClock counts its reads.
type countingClock struct {
	sluice.Clock
	reads atomic.Int64
}

func (c *countingClock) Now() int64 { c.reads.Add(1); return c.Clock.Now() }

// An exact take over the embedded store, the deny cache off, reads no
// clock in this layer but for the hot-key sample (one take in hotSample):
// the store reads its own.
func TestExactTakesOnTheEmbeddedStoreReadTheClockOnlyToSample(t *testing.T) {
	clock := &countingClock{Clock: sluice.NewManualClock(epoch)}
	g := New(memory.New(memory.WithClock(sluice.NewManualClock(epoch))), Options{
		Local: memory.New(), Clock: clock, NoDenyCache: true, ManualTick: true,
		Sharing: func(string) sluice.Sharing { return sluice.Sharing{Mode: sluice.SyncExact} },
	})
	defer g.Close()
	const takes = 800
	var out [1]sluice.Decision
	for range takes {
		if err := g.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: sluice.Limit{Rate: 1 << 20, Period: time.Hour}, Cost: 1}}, out[:]); err != nil || !out[0].Allowed {
			t.Fatalf("take: %v %+v", err, out[0])
		}
	}
	// About takes/hotSample (100) reads for the samples; every take read
	// the clock before.
	if n := clock.reads.Load(); n > 2*takes/hotSample {
		t.Fatalf("%d takes read the clock %d times, want about %d (the hot-key samples)", takes, n, takes/hotSample)
	}
}

// The calls the store decides as they came (every take exact, unsharded, at
// its whole limit, no deny cache) decide as the store alone does, on random
// traffic: several takes a call, all or nothing, costs above the burst and
// of zero, time standing still and jumping.
func TestCallsDecidedAsTheyCameMatchTheStoreAlone(t *testing.T) {
	var asked atomic.Int64 // Sharing and Scale asked
	exact := func(string) sluice.Sharing { asked.Add(1); return sluice.Sharing{Mode: sluice.SyncExact} }
	whole := func(string) float64 { asked.Add(1); return 1 }
	for _, c := range []struct {
		name     string
		allExact func() bool
		asked    bool
	}{
		{"asked take by take", nil, true},
		{"all exact, said once a call", func() bool { return true }, false},
		{"not all exact, asked take by take", func() bool { return false }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			asked.Store(0)
			clock := sluice.NewManualClock(epoch)
			direct := New(memory.New(memory.WithClock(clock)), Options{Local: memory.New(), Clock: clock, NoDenyCache: true, ManualTick: true,
				Sharing: exact, Scale: whole, AllExact: c.allExact})
			defer direct.Close()
			matchTheStoreAlone(t, clock, direct)
			if got := asked.Load() > 0; got != c.asked {
				t.Fatalf("Sharing and Scale asked %d times", asked.Load())
			}
		})
	}
}

// matchTheStoreAlone sends 5,000 random calls to direct and to the
// embedded store alone, both on clock, and wants the same decisions and
// one store call for each.
func matchTheStoreAlone(t *testing.T, clock *sluice.ManualClock, direct *Store) {
	alone := memory.New(memory.WithClock(clock))
	limits := []sluice.Limit{
		{Rate: 5, Period: time.Second, Burst: 3},
		{Rate: 10, Period: time.Minute, Algorithm: sluice.TokenBucket},
		{Rate: 4, Period: 2 * time.Second, Algorithm: sluice.FixedWindow},
		{Rate: 3, Period: time.Second, Algorithm: sluice.SlidingWindow},
	}
	rng := rand.New(rand.NewPCG(7, 11))
	admitted := 0
	const calls = 5000
	for step := range calls {
		n := 1 + rng.IntN(3)
		takes := make([]sluice.Take, n)
		for i := range takes {
			r := rng.IntN(len(limits))
			takes[i] = sluice.Take{Rule: fmt.Sprint("r", r), Key: fmt.Sprint("k", rng.IntN(3)), Limit: limits[r], Cost: int64(rng.IntN(5))}
		}
		var want, got [3]sluice.Decision
		if err := alone.Take(context.Background(), takes, want[:n]); err != nil {
			t.Fatal(err)
		}
		for i := range takes {
			want[i].Rule, want[i].Limit = takes[i].Rule, takes[i].Limit
		}
		if err := direct.Take(context.Background(), takes, got[:n]); err != nil {
			t.Fatal(err)
		}
		if want != got {
			t.Fatalf("step %d, takes %+v:\nthe store alone %+v\nthrough the layer %+v", step, takes, want[:n], got[:n])
		}
		if want[0].Allowed {
			admitted++
		}
		if rng.IntN(4) == 0 {
			clock.Advance(time.Duration(rng.IntN(800)) * time.Millisecond)
		}
	}
	if admitted == 0 || admitted == calls {
		t.Fatalf("%d of %d calls admitted: the traffic does not exercise both answers", admitted, calls)
	}
	if err := direct.Take(context.Background(), nil, nil); err != nil { // no take: no call
		t.Fatal(err)
	}
	if n := direct.Stats().RemoteCalls; n != calls {
		t.Fatalf("%d calls and an empty one made %d calls to the store, want one each but the empty one", calls, n)
	}
}
