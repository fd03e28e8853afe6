package memory

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
)

var epoch = time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)

func gcraLimit() sluice.Limit { return sluice.Limit{Rate: 10, Period: time.Minute} }

func keysOf(s *Store) (keys int, evictions uint64) {
	for _, st := range s.Stats() {
		keys += st.Keys
		evictions += st.Evictions
	}
	return keys, evictions
}

func slotsOf(s *Store) int {
	n := 0
	for _, entries := range *s.tables.Load() {
		g := entries[0].t.(*wordTable)
		for i := range g.shards {
			if p := g.shards[i].slots.Load(); p != nil {
				n += len(*p)
			}
		}
	}
	return n
}

func TestFloodOfDistinctKeysStaysWithinTheBound(t *testing.T) {
	const bound = 128 * 40
	clock := sluice.NewManualClock(epoch)
	s := New(WithClock(clock), WithMaxKeys(bound))
	l, _ := s.Limiter("flood", gcraLimit())
	for i := range 20 * bound {
		if !l.Allow(fmt.Sprint("attacker-", i)) {
			t.Fatalf("fresh key %d refused", i)
		}
	}
	keys, ev := keysOf(s)
	if keys > bound {
		t.Fatalf("%d keys held, bound %d", keys, bound)
	}
	if ev < uint64(19*bound) {
		t.Fatalf("%d evictions counted, want at least %d", ev, 19*bound)
	}
	maxSlots := (*s.tables.Load())["flood"][0].t.(*wordTable).maxSlots
	if got := slotsOf(s); got > numShards*maxSlots {
		t.Fatalf("%d slots allocated, more than the bound allows (%d)", got, numShards*maxSlots)
	}
}

func TestDeadKeysAreReusedWithoutEviction(t *testing.T) {
	const bound = 128 * 16
	clock := sluice.NewManualClock(epoch)
	s := New(WithClock(clock), WithMaxKeys(bound))
	l, _ := s.Limiter("r", gcraLimit())
	for round := range 10 {
		// A quarter of the bound per round: no shard gets more live keys
		// than its share, so only the dead keys of past rounds can make room.
		for i := range bound / 4 {
			l.Allow(fmt.Sprintf("round%d-key%d", round, i))
		}
		clock.Advance(time.Minute) // every key of this round is idle again
	}
	keys, ev := keysOf(s)
	if ev != 0 {
		t.Fatalf("%d evictions, want 0: dead keys should have been reused", ev)
	}
	if keys > bound {
		t.Fatalf("%d keys held, bound %d", keys, bound)
	}
}

func TestEvictedKeyReturnsFresh(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	s := New(WithClock(clock), WithMaxKeys(1)) // one key per shard
	l, _ := s.Limiter("r", sluice.Limit{Rate: 2, Period: time.Hour})
	if !l.Allow("victim") {
		t.Fatal("limit of 2 per hour not applied")
	}
	// The victim has one unit left: not limited, so evictable. Flood with
	// keys that each keep one unit too, until the victim's shard evicts it.
	for i := 0; ; i++ {
		l.Allow(fmt.Sprint("other-", i))
		if _, ev := keysOf(s); ev > 0 && !l.word.contains("victim") {
			break
		}
		if i > 100000 {
			t.Fatal("victim never evicted")
		}
	}
	if !l.Allow("victim") || !l.Allow("victim") || l.Allow("victim") {
		t.Fatal("evicted key did not come back fresh with 2 units")
	}
}

// A flood of new keys at the key bound must never reset a key that is over
// its limit: limited keys are not evicted, and once a shard holds nothing
// else, new keys share the rule's strict overflow state.
func TestFloodAtKeyBoundNeverResetsALimitedKey(t *testing.T) {
	const flood = 60_000 // 40,000 past the point where every shard is full, 40 times the bound
	for _, alg := range sluice.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			clock := sluice.NewManualClock(epoch)
			s := New(WithClock(clock), WithMaxKeys(1024))
			lim := sluice.Limit{Rate: 3, Period: time.Hour, Algorithm: alg}
			take := func(key string) bool {
				var out [1]sluice.Decision
				if err := s.Take(context.Background(), []sluice.Take{{Rule: "r", Key: key, Limit: lim, Cost: 1}}, out[:]); err != nil {
					t.Fatal(err)
				}
				return out[0].Allowed
			}
			// Take until refused: a leaky queue admits one more than its
			// queue holds (one leaves at once).
			fill := func(key string) (admitted int) {
				for take(key) {
					if admitted++; admitted > 10 {
						t.Fatalf("%s: more than 10 admitted on a limit of 3", key)
					}
				}
				return admitted
			}
			perKey := fill("victim")
			overflowAdmitted := 0
			for i := 0; i < flood; i++ {
				n := fill(fmt.Sprint("flood-", i)) // each flood key reaches its limit too
				if i > 20_000 {                    // by then every shard is full of limited keys
					overflowAdmitted += n
				}
				if i%20_000 == 0 && take("victim") {
					t.Fatalf("after %d flood keys the victim was admitted again: it was evicted", i)
				}
				clock.Advance(time.Microsecond)
			}
			if take("victim") {
				t.Fatal("victim admitted after the flood")
			}
			var ov uint64
			for _, st := range s.Stats() {
				ov += st.Overflows
			}
			if ov == 0 {
				t.Fatal("no take was counted as overflow")
			}
			// Past the bound, new keys share one strict state: only its
			// limit's worth got through, not three per key.
			if overflowAdmitted > perKey {
				t.Fatalf("%d units admitted to new keys past the bound; the shared overflow state allows %d", overflowAdmitted, perKey)
			}
		})
	}
}

func (t *wordTable) contains(key string) bool {
	fp, i := t.locate(key)
	sh := &t.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return t.find(sh, fp) != nil
}

func TestForgetUnlocksAKey(t *testing.T) {
	s := New(WithClock(sluice.NewManualClock(epoch)))
	l, _ := s.Limiter("login", sluice.Limit{Rate: 1, Period: time.Hour})
	l.Allow("u42")
	if l.Allow("u42") {
		t.Fatal("second attempt allowed")
	}
	if !s.Forget("login", "u42") {
		t.Fatal("Forget found no state")
	}
	if !l.Allow("u42") {
		t.Fatal("forgotten key still limited")
	}
	if s.Forget("login", "nobody") {
		t.Fatal("Forget reported state for an unknown key")
	}
}

func TestLimiterSharesKeysWithTake(t *testing.T) {
	s := New(WithClock(sluice.NewManualClock(epoch)))
	lim := sluice.Limit{Rate: 3, Period: time.Minute}
	l, err := s.Limiter("r", lim)
	if err != nil {
		t.Fatal(err)
	}
	d, _ := l.Take("k", 2)
	out := make([]sluice.Decision, 1)
	s.Take(context.Background(), []sluice.Take{{Rule: "r", Key: "k", Limit: lim, Cost: 0}}, out)
	if d.Remaining != 1 || out[0].Remaining != 1 {
		t.Fatalf("limiter left %d, store sees %d; want 1 and 1", d.Remaining, out[0].Remaining)
	}
	if _, err := l.Take("k", -1); err == nil {
		t.Fatal("negative cost accepted")
	}
	if _, err := s.Limiter("bad", sluice.Limit{}); err == nil {
		t.Fatal("invalid limit accepted")
	}
}

func TestChangedLimitStartsFreshUnchangedKeepsCounts(t *testing.T) {
	s := New(WithClock(sluice.NewManualClock(epoch)))
	old := sluice.Limit{Rate: 2, Period: time.Minute}
	a, _ := s.Limiter("r", old)
	a.Take("k", 2)
	same, _ := s.Limiter("r", old)
	if d, _ := same.Take("k", 0); d.Remaining != 0 {
		t.Fatalf("same rule and limit lost its count: %+v", d)
	}
	changed, _ := s.Limiter("r", sluice.Limit{Rate: 5, Period: time.Minute})
	if d, _ := changed.Take("k", 0); d.Remaining != 5 {
		t.Fatalf("changed limit kept old state: %+v", d)
	}
}

func TestMultiTakeBeyondTheStackBuffer(t *testing.T) {
	s := New(WithClock(sluice.NewManualClock(epoch)))
	var takes []sluice.Take
	for i := range 3 * maxLocks {
		takes = append(takes, sluice.Take{Rule: fmt.Sprint("r", i%5), Key: fmt.Sprint("k", i), Limit: gcraLimit(), Cost: 1})
	}
	takes = append(takes, sluice.Take{Rule: "tight", Key: "k", Limit: sluice.Limit{Rate: 1, Period: time.Hour}, Cost: 1})
	out := make([]sluice.Decision, len(takes))
	for round := range 2 {
		if err := s.Take(context.Background(), takes, out); err != nil {
			t.Fatal(err)
		}
		for i, d := range out[:len(out)-1] {
			if !d.Allowed || d.Remaining != 9 {
				t.Fatalf("round %d take %d: %+v, want allowed with 9 remaining", round, i, d)
			}
		}
		if want := round == 0; out[len(out)-1].Allowed != want {
			t.Fatalf("round %d: tight rule allowed=%v", round, out[len(out)-1].Allowed)
		}
	}
}

// Concurrent growth, eviction and takes across many keys, for the race
// detector, with a bound small enough to force evictions.
func TestConcurrentGrowthAndEviction(t *testing.T) {
	s := New(WithMaxKeys(128*64), WithClock(sluice.NewManualClock(epoch)))
	lims := []sluice.Limit{gcraLimit(), {Rate: 4, Period: time.Second, Algorithm: sluice.SlidingLog}}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			out := make([]sluice.Decision, 2)
			for i := range 5000 {
				k := fmt.Sprint(g, "-", i%3000)
				takes := []sluice.Take{{Rule: "a", Key: k, Limit: lims[0], Cost: 1}, {Rule: "b", Key: k, Limit: lims[1], Cost: 1}}
				if err := s.Take(context.Background(), takes, out); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if keys, _ := keysOf(s); keys > 2*128*64 {
		t.Fatalf("%d keys, bound %d", keys, 2*128*64)
	}
}

func BenchmarkLimiterHotKey(b *testing.B) {
	c := sluice.NewManualClock(epoch)
	s := New(WithClock(c))
	l, _ := s.Limiter("r", sluice.Limit{Rate: 100, Period: time.Second})
	for b.Loop() {
		c.Advance(time.Millisecond)
		l.Allow("hot")
	}
}

// BenchmarkStoreTakeOne is a call of one take, as a request matching one
// rule makes: a refused key (over its limit for the whole run) and an
// allowed one (a limit no run reaches), GCRA and token bucket.
func BenchmarkStoreTakeOne(b *testing.B) {
	for _, alg := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket} {
		for _, tc := range []struct {
			name string
			rate int64
		}{{"refused", 1}, {"allowed", 1 << 40}} {
			b.Run(fmt.Sprint(alg, "/", tc.name), func(b *testing.B) {
				s := New(WithClock(sluice.NewManualClock(epoch)))
				takes := []sluice.Take{{Rule: "r", Key: "203.0.113.7", Limit: sluice.Limit{Rate: tc.rate, Period: time.Hour, Algorithm: alg}, Cost: 1}}
				out := make([]sluice.Decision, 1)
				ctx := context.Background()
				for b.Loop() {
					if err := s.Take(ctx, takes, out); err != nil {
						b.Fatal(err)
					}
				}
				if out[0].Allowed != (tc.name == "allowed") {
					b.Fatalf("allowed %v", out[0].Allowed)
				}
			})
		}
	}
}

// BenchmarkLimiterHotKeyTokenBucket is BenchmarkLimiterHotKey on a token
// bucket: the packed one-word bucket (wordtable.go).
func BenchmarkLimiterHotKeyTokenBucket(b *testing.B) {
	c := sluice.NewManualClock(epoch)
	s := New(WithClock(c))
	l, _ := s.Limiter("r", sluice.Limit{Rate: 100, Period: time.Second, Algorithm: sluice.TokenBucket})
	for b.Loop() {
		c.Advance(time.Millisecond)
		l.Allow("hot")
	}
}

// Lock-free single takes and locked multi-key takes on one hot GCRA key at
// one instant: together they admit exactly the burst, and the second rule is
// charged exactly for the multi-key takes admitted.
func TestLockFreeAndMultiKeyTakesShareOneKeyExactly(t *testing.T) {
	for round := range 20 {
		s := New(WithClock(sluice.NewManualClock(epoch)))
		a := sluice.Limit{Rate: 100, Period: time.Hour}
		b := sluice.Limit{Rate: 1000, Period: time.Hour, Algorithm: sluice.SlidingLog}
		single, _ := s.Limiter("a", a)
		var singles, multis sync.WaitGroup
		var nSingle, nMulti [8]int
		for g := range 8 {
			if g%2 == 0 {
				singles.Go(func() {
					for range 50 {
						if single.Allow("k") {
							nSingle[g]++
						}
					}
				})
				continue
			}
			multis.Go(func() {
				out := make([]sluice.Decision, 2)
				takes := []sluice.Take{{Rule: "a", Key: "k", Limit: a, Cost: 1}, {Rule: "b", Key: "k", Limit: b, Cost: 1}}
				for range 50 {
					if err := s.Take(context.Background(), takes, out); err != nil {
						t.Error(err)
						return
					}
					if out[0].Allowed && out[1].Allowed {
						nMulti[g]++
					}
				}
			})
		}
		singles.Wait()
		multis.Wait()
		total, multi := 0, 0
		for g := range 8 {
			total += nSingle[g] + nMulti[g]
			multi += nMulti[g]
		}
		if total != 100 {
			t.Fatalf("round %d: %d admitted on a burst of 100", round, total)
		}
		bl, _ := s.Limiter("b", b)
		if d, _ := bl.Take("k", 0); d.Remaining != int64(1000-multi) {
			t.Fatalf("round %d: rule b has %d remaining, want %d", round, d.Remaining, 1000-multi)
		}
	}
}

func TestFloodEvictsForEveryAlgorithm(t *testing.T) {
	const bound = 128 * 8
	for _, a := range sluice.Algorithms() {
		clock := sluice.NewManualClock(epoch)
		s := New(WithClock(clock), WithMaxKeys(bound))
		l, _ := s.Limiter("flood", sluice.Limit{Rate: 10, Period: time.Hour, Algorithm: a})
		for i := range 10 * bound {
			if d, _ := l.Take(fmt.Sprint("k", i), 1); !d.Allowed {
				t.Fatalf("%v: fresh key %d refused: %+v", a, i, d)
			}
		}
		keys, ev := keysOf(s)
		if keys > bound || ev < uint64(9*bound) {
			t.Fatalf("%v: %d keys (bound %d), %d evictions", a, keys, bound, ev)
		}
	}
}

func TestSweepGivesMemoryBackAndChangesNoAnswer(t *testing.T) {
	for _, a := range sluice.Algorithms() {
		clock := sluice.NewManualClock(epoch)
		swept, control := New(WithClock(clock)), New(WithClock(clock))
		lim := sluice.Limit{Rate: 2, Period: time.Minute, Algorithm: a}
		l, _ := swept.Limiter("r", lim)
		c, _ := control.Limiter("r", lim)
		for i := range 20000 {
			l.Take(fmt.Sprint("burst-", i), 1)
			c.Take(fmt.Sprint("burst-", i), 1)
		}
		clock.Advance(5 * time.Minute) // every key is idle
		l.Take("steady", 1)
		c.Take("steady", 1)
		swept.Sweep()
		if keys, _ := keysOf(swept); keys != 1 {
			t.Fatalf("%v: %d keys after a sweep, want only the live one", a, keys)
		}
		for _, k := range []string{"steady", "burst-7", "never-seen"} {
			got, _ := l.Take(k, 0)
			want, _ := c.Take(k, 0)
			if got != want || (k == "steady" && got.ResetAfter == 0) {
				t.Fatalf("%v: key %s after a sweep: %+v, without: %+v", a, k, got, want)
			}
		}
	}
}

func TestJanitorRunsAndStops(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	s := New(WithClock(clock), WithSweepEvery(time.Millisecond))
	defer s.Close()
	l, _ := s.Limiter("r", gcraLimit())
	for i := range 1000 {
		l.Allow(fmt.Sprint(i))
	}
	clock.Advance(time.Hour)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if keys, _ := keysOf(s); keys == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("janitor did not sweep within 10s")
		}
		time.Sleep(time.Millisecond)
	}
	s.Close()
	s.Close()
	// Closed, the janitor no longer sweeps: new dead keys stay.
	for i := range 100 {
		l.Allow(fmt.Sprint("after-", i))
	}
	if keys, _ := keysOf(s); keys != 100 {
		t.Fatalf("%d keys before", keys)
	}
	clock.Advance(time.Hour)
	time.Sleep(20 * time.Millisecond) // 20 of its ticks, had it not stopped
	if keys, _ := keysOf(s); keys != 100 {
		t.Fatalf("%d keys after Close, want the 100 left unswept", keys)
	}
}

// A packed bucket under a clock that steps back looks emptier, never fuller.
func TestPackedBucketsAreConservativeWhenTheClockStepsBack(t *testing.T) {
	for _, a := range []sluice.Algorithm{sluice.TokenBucket, sluice.LeakyMeter, sluice.GCRA, sluice.LeakyQueue} {
		clock := sluice.NewManualClock(epoch)
		s := New(WithClock(clock))
		l, _ := s.Limiter("r", sluice.Limit{Rate: 10, Period: time.Second, Burst: 5, Algorithm: a})
		drained := 0
		for {
			if d, _ := l.Take("k", 1); !d.Allowed {
				break
			}
			if drained++; drained > 10 {
				t.Fatalf("%v: more than 10 admitted at one instant on a burst of 5", a)
			}
		}
		// A drained key seen from an earlier time must look no fuller: it
		// still refuses, whatever the step back.
		for _, back := range []time.Duration{time.Millisecond, time.Second, time.Minute, 24 * time.Hour} {
			clock.Advance(-back)
			if d, _ := l.Take("k", 1); d.Allowed || d.Remaining != 0 {
				t.Fatalf("%v: a drained bucket, %v earlier, admits (remaining %d)", a, back, d.Remaining)
			}
			clock.Advance(back)
		}
		// Full again a second later, and no fuller from an earlier time.
		clock.Advance(time.Second)
		later, _ := l.Take("k", 0)
		clock.Advance(-time.Minute)
		if back, _ := l.Take("k", 0); back.Remaining > later.Remaining {
			t.Fatalf("%v: stepping back a minute shows %d remaining, more than the %d of the later time", a, back.Remaining, later.Remaining)
		}
	}
}

// A sweep must not forget a sliding log whose oldest entry has left the
// window while a newer one is still in it.
func TestSweepKeepsALogWithAnEntryInTheWindow(t *testing.T) {
	clock := sluice.NewManualClock(epoch)
	s := New(WithClock(clock))
	l, _ := s.Limiter("r", sluice.Limit{Rate: 2, Period: time.Second, Algorithm: sluice.SlidingLog})
	l.Allow("k")
	clock.Advance(500 * time.Millisecond)
	l.Allow("k")
	clock.Advance(600 * time.Millisecond) // the first entry has left, the second has not
	s.Sweep()
	if !l.Allow("k") {
		t.Fatal("one unit free, refused")
	}
	if l.Allow("k") {
		t.Fatal("the sweep forgot an entry still in the window: a third unit within one second")
	}
}

// Multi-key takes that always refuse hold units of a key tentatively and
// give them back by restoring its word; lock-free takes of the same key must
// never decide on those units (the shard's busy flag), or a restore would
// erase a lock-free take and the key would admit more than its limit. Every
// multi-key take here refuses (its other key is exhausted), so every one
// undoes while lock-free takes race it.
func TestLockFreeTakesNeverRaceAMultiKeyUndo(t *testing.T) {
	deadline := time.Now().Add(5 * time.Second)
	for round := 0; round < 10 && time.Now().Before(deadline); round++ {
		s := New(WithClock(sluice.NewManualClock(epoch)))
		a := sluice.Limit{Rate: 100, Period: time.Hour}
		b := sluice.Limit{Rate: 1, Period: time.Hour}
		single, _ := s.Limiter("a", a)
		exhausted, _ := s.Limiter("b", b)
		exhausted.Allow("k") // b:k refuses from now on
		var wg sync.WaitGroup
		var admitted atomic.Int64
		var undone atomic.Int64
		stop := make(chan struct{})
		for range 2 {
			wg.Go(func() {
				out := make([]sluice.Decision, 2)
				takes := []sluice.Take{{Rule: "a", Key: "k", Limit: a, Cost: 1}, {Rule: "b", Key: "k", Limit: b, Cost: 1}}
				for i := 0; i < 200_000; i++ {
					select {
					case <-stop:
						return
					default:
					}
					s.Take(context.Background(), takes, out)
					if out[0].Allowed { // a's unit was held, then given back
						undone.Add(1)
					}
				}
			})
		}
		for undone.Load() == 0 && time.Now().Before(deadline) {
			runtime.Gosched() // let the undos start first
		}
		var singles sync.WaitGroup
		for range 4 {
			singles.Go(func() {
				for range 20_000 {
					if single.Allow("k") {
						admitted.Add(1)
					}
				}
			})
		}
		singles.Wait()
		close(stop)
		wg.Wait()
		if undone.Load() == 0 {
			t.Fatal("no multi-key take held a unit of a:k: the race was not exercised")
		}
		if n := admitted.Load(); n != 100 {
			t.Fatalf("round %d: lock-free takes admitted %d on a limit of 100, racing %d undone multi-key takes", round, n, undone.Load())
		}
	}
}

// At the key bound the keys closest to idle go first: their loss changes
// the fewest answers. Half the keys are nearly idle, half are busy (not
// limited); a flood of new keys must evict mostly the nearly idle ones.
func TestEvictionTakesTheMostIdleKeysFirst(t *testing.T) {
	for _, alg := range []sluice.Algorithm{sluice.GCRA, sluice.SlidingLog, sluice.TokenBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			clock := sluice.NewManualClock(epoch)
			s := New(WithClock(clock), WithMaxKeys(1024))
			lim := sluice.Limit{Rate: 3, Period: time.Hour, Algorithm: alg}
			l, _ := s.Limiter("r", lim)
			for i := range 512 {
				l.Take(fmt.Sprint("light-", i), 1)
			}
			clock.Advance(19 * time.Minute) // light keys are nearly back to full
			for i := range 512 {
				l.Take(fmt.Sprint("busy-", i), 2)
			}
			for i := range 300 {
				l.Take(fmt.Sprint("new-", i), 1)
			}
			fresh := func(prefix string) (n int) {
				for i := range 512 {
					if d, _ := l.Take(fmt.Sprint(prefix, i), 0); d.Remaining == 3 {
						n++
					}
				}
				return n
			}
			light, busy := fresh("light-"), fresh("busy-")
			if light == 0 {
				t.Fatal("no light key was evicted: the bound was not reached")
			}
			if busy*4 > light {
				t.Fatalf("%d busy keys evicted against %d nearly idle ones: eviction does not take the most idle first", busy, light)
			}
		})
	}
}

// The open reservations are bounded: at the bound, expired ones make room;
// when the open ones fill it, a new reservation is refused before anything
// is taken (it could never be settled), and counted.
func TestReservationsAreBounded(t *testing.T) {
	clock := sluice.NewManualClock(time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC))
	s := New(WithClock(clock), WithMaxHolds(2))
	l := sluice.Limit{Rate: 100, Period: time.Minute}
	out := make([]sluice.Decision, 1)
	hold := func(id string, cost int64, settle bool) sluice.Decision {
		t.Helper()
		tk := sluice.Take{Rule: "r", Key: "k", Limit: l, Cost: cost, Hold: id, HoldFor: time.Second, Settle: settle}
		if err := s.Take(context.Background(), []sluice.Take{tk}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	hold("a", 5, false)
	hold("b", 5, false)
	if d := hold("c", 5, false); d.Allowed || d.Reason != sluice.ReasonUnavailable || d.RetryAfter != time.Second { // the bound is full
		t.Fatalf("a reservation beyond the bound: %+v, want refused until the earliest deadline", d)
	}
	if s.OpenHolds() != 2 || s.RefusedHolds() != 1 {
		t.Fatalf("open %d, refused %d: want 2, 1", s.OpenHolds(), s.RefusedHolds())
	}
	if d := hold("c", 0, true); d.Reason != sluice.ReasonNoReservation || d.Remaining != 90 {
		t.Fatalf("the refused reservation: %+v, want none and nothing taken (90 left)", d)
	}
	clock.Advance(time.Second) // a and b expire: at, not after, their deadline
	hold("d", 5, false)
	if s.OpenHolds() != 1 || s.RefusedHolds() != 1 {
		t.Fatalf("after the deadline: open %d, refused %d: want 1, 1", s.OpenHolds(), s.RefusedHolds())
	}
	if d := hold("d", 1, true); !d.Allowed {
		t.Fatalf("settle d: %+v", d)
	}
	long := sluice.Take{Rule: "r", Key: "k", Limit: l, Cost: 1, Hold: strings.Repeat("x", sluice.MaxHoldLen+1), HoldFor: time.Second}
	if err := s.Take(context.Background(), []sluice.Take{long}, out); err == nil {
		t.Fatal("an overlong reservation id was accepted")
	}
}
