package memory

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
)

// Every table grows through several rebuilds as keys arrive; each key must
// keep its state through them (a key re-placed where lookups do not find it
// would come back fresh).
func TestGrowthKeepsEveryKeysState(t *testing.T) {
	for _, alg := range sluice.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			s := New(WithClock(sluice.NewManualClock(epoch)))
			lim := sluice.Limit{Rate: 1, Period: time.Hour, Algorithm: alg}
			take := func(key string) bool {
				var out [1]sluice.Decision
				s.Take(context.Background(), []sluice.Take{{Rule: "r", Key: key, Limit: lim, Cost: 1}}, out[:])
				return out[0].Allowed
			}
			const n = 6000
			for i := range n {
				for take(fmt.Sprint("k", i)) { // drain it (a leaky queue takes 2)
				}
			}
			for i := range n {
				if take(fmt.Sprint("k", i)) {
					t.Fatalf("key %d admitted again after the table grew: its state was lost", i)
				}
			}
		})
	}
}

// A multi-key take that another key refuses gives back what it held, on
// every key, wherever the key sits in its shard's probe sequence.
func TestRefusedMultiKeyTakesGiveBackOnEveryKey(t *testing.T) {
	for _, alg := range sluice.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			s := New(WithClock(sluice.NewManualClock(epoch)))
			loose := sluice.Limit{Rate: 10, Period: time.Hour, Algorithm: alg}
			tight := sluice.Limit{Rate: 1, Period: time.Hour}
			ctx := context.Background()
			out := make([]sluice.Decision, 2)
			s.Take(ctx, []sluice.Take{{Rule: "tight", Key: "x", Limit: tight, Cost: 1}}, out[:1])
			const n = 3000
			var want int64
			for i := range n {
				k := fmt.Sprint("k", i)
				s.Take(ctx, []sluice.Take{{Rule: "loose", Key: k, Limit: loose, Cost: 1}}, out[:1]) // present
				s.Take(ctx, []sluice.Take{{Rule: "loose", Key: k, Limit: loose}}, out[:1])
				want = out[0].Remaining
				s.Take(ctx, []sluice.Take{{Rule: "loose", Key: k, Limit: loose, Cost: 2}, {Rule: "tight", Key: "x", Limit: tight, Cost: 1}}, out)
				if out[1].Allowed {
					t.Fatal("tight admitted twice")
				}
			}
			for i := range n {
				s.Take(ctx, []sluice.Take{{Rule: "loose", Key: fmt.Sprint("k", i), Limit: loose}}, out[:1])
				if out[0].Remaining != want {
					t.Fatalf("key %d: %d remaining after refused multi-key takes, want %d", i, out[0].Remaining, want)
				}
			}
		})
	}
}

// A token bucket drained exactly at now is not idle at now: a sweep at that
// instant must keep it.
func TestSweepAtTheDrainInstantKeepsTheBucket(t *testing.T) {
	for _, alg := range []sluice.Algorithm{sluice.TokenBucket, sluice.LeakyMeter} {
		clock := sluice.NewManualClock(epoch)
		s := New(WithClock(clock))
		l, _ := s.Limiter("r", sluice.Limit{Rate: 2, Period: time.Hour, Algorithm: alg})
		l.Allow("k")
		l.Allow("k")
		s.Sweep()
		if l.Allow("k") {
			t.Fatalf("%v: a drained bucket admitted after a sweep at the same instant", alg)
		}
	}
}

// A shard full of limited keys sends new keys to the overflow state only
// while those keys are limited: once they are idle again, a new key gets a
// count of its own.
func TestOverflowEndsWhenLimitedKeysRecover(t *testing.T) {
	for _, alg := range sluice.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			clock := sluice.NewManualClock(epoch)
			s := New(WithClock(clock), WithMaxKeys(128*8)) // eight keys per shard
			lim := sluice.Limit{Rate: 3, Period: time.Minute, Algorithm: alg}
			take := func(key string) bool {
				var out [1]sluice.Decision
				s.Take(context.Background(), []sluice.Take{{Rule: "r", Key: key, Limit: lim, Cost: 1}}, out[:])
				return out[0].Allowed
			}
			for i := range 2000 { // every shard full of limited keys, the overflow used up
				for take(fmt.Sprint("k", i)) {
				}
			}
			clock.Advance(time.Hour) // every key idle again
			for i := range 64 {      // at one instant: the overflow state could serve only one of them
				key := fmt.Sprint("new", i)
				if !take(key) || !take(key) || !take(key) {
					t.Fatalf("new key %d, an hour later, did not get a count of its own", i)
				}
			}
		})
	}
}

// A key that is present is taken lock-free: only its first take (the
// insert) goes to the locked path.
func TestPresentKeysAreTakenLockFree(t *testing.T) {
	s := New(WithClock(sluice.NewManualClock(epoch)))
	l, _ := s.Limiter("r", sluice.Limit{Rate: 1000, Period: time.Hour})
	const n = 2000
	for i := range n {
		l.Allow(fmt.Sprint("k", i))
	}
	before := l.word.locked.Load()
	if before < n {
		t.Fatalf("%d locked takes for %d inserts", before, n)
	}
	for range 5 {
		for i := range n {
			l.Allow(fmt.Sprint("k", i))
		}
	}
	if got := l.word.locked.Load() - before; got != 0 {
		t.Fatalf("%d takes of present keys went to the locked path", got)
	}
}

// sizeFor: the smallest power of two, at least minSlots, that leaves the
// shard at most half full, up to maxSlots.
func TestSizeFor(t *testing.T) {
	for _, tc := range []struct{ keys, max, want int }{
		{0, 1024, 8}, {3, 1024, 8}, {4, 1024, 16}, {7, 1024, 16}, {8, 1024, 32}, {100, 1024, 256}, {511, 1024, 1024}, {5000, 1024, 1024},
	} {
		if got := sizeFor(tc.keys, tc.max); got != tc.want {
			t.Errorf("sizeFor(%d, %d) = %d, want %d", tc.keys, tc.max, got, tc.want)
		}
	}
}

// A take above a floor that another take of the call refused reports what
// stands after the undo, less its floor, for every algorithm.
func TestARefusedCallReportsAFloorTakeAboveItsFloor(t *testing.T) {
	for _, alg := range sluice.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			s := New(WithClock(sluice.NewManualClock(epoch)))
			lim := sluice.Limit{Rate: 10, Period: time.Hour, Algorithm: alg}
			full := sluice.Limit{Rate: 1, Period: time.Hour} // gcra: refuses its second take
			var one [1]sluice.Decision
			s.Take(context.Background(), []sluice.Take{{Rule: "full", Key: "k", Limit: full, Cost: 1}}, one[:])
			var out [2]sluice.Decision
			takes := []sluice.Take{{Rule: "tier", Key: "k", Limit: lim, Cost: 1, Floor: 3}, {Rule: "full", Key: "k", Limit: full, Cost: 1}}
			if err := s.Take(context.Background(), takes, out[:]); err != nil {
				t.Fatal(err)
			}
			if out[1].Allowed || out[0].Remaining != 10-3 {
				t.Fatalf("the floor take in a refused call: %+v, want 7 left above the floor of 3 (nothing taken)", out[0])
			}
		})
	}
}

// A packed bucket's level at every edge: part full, full (capped at D), in
// debt (e after now: negative), long full across an overflow of now - e,
// in a debt beyond the int64 range, and a debt bounded at maxDebt; and the
// packing of (last, tokens): the instant it was empty, a debt after last, a
// debt beyond the range held at the largest word, never below fresh.
func TestPackedBucketEdges(t *testing.T) {
	p := &algo.Params{D: 1000}
	now := epoch.UnixNano()
	for _, tc := range []struct {
		name   string
		e, now int64
		want   int64
	}{
		{"part full", now - 300, now, 300},
		{"full", now - 5000, now, 1000},
		{"in debt", now + 700, now, -700},
		{"long full, now - e overflowing", math.MinInt64 + 1, now, 1000},
		{"a debt beyond now's range", math.MaxInt64 - 10, -now, -maxDebt},
		{"a debt bounded", now + maxDebt + 10, now, -maxDebt},
	} {
		if got := bucketLevel(p, tc.e, tc.now); got != tc.want {
			t.Errorf("bucketLevel, %s: %d, want %d", tc.name, got, tc.want)
		}
	}
	for _, tc := range []struct {
		name         string
		last, tokens int64
		want         int64
	}{
		{"tokens held", now, 300, now - 300},
		{"a debt", now, -700, now + 700},
		{"a debt beyond the range", math.MaxInt64 - 10, -100, math.MaxInt64},
		{"empty at the first instant", math.MinInt64 + 100, 100, fresh}, // e = MinInt64 is no word: fresh
		{"empty before the first instant", math.MinInt64 + 5, 100, fresh},
	} {
		if got := packBucket(tc.last, tc.tokens); got != tc.want {
			t.Errorf("packBucket, %s: %d, want %d", tc.name, got, tc.want)
		}
	}
}
