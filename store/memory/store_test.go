package memory

import (
	"context"
	"fmt"
	"sync"
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
	for _, t := range *s.tables.Load() {
		g := t.(*table[gcraCell, *gcraCell])
		for i := range g.shards {
			n += len(g.shards[i].slots)
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
	maxSlots := (*s.tables.Load())[tableKey{"flood", gcraLimit()}].(*table[gcraCell, *gcraCell]).maxSlots
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
	l, _ := s.Limiter("r", sluice.Limit{Rate: 1, Period: time.Hour})
	if !l.Allow("victim") || l.Allow("victim") {
		t.Fatal("limit of 1 per hour not applied")
	}
	// Flood until the victim's shard evicts it.
	for i := 0; ; i++ {
		l.Allow(fmt.Sprint("other-", i))
		if _, ev := keysOf(s); ev > 0 && !l.t.(*table[gcraCell, *gcraCell]).contains("victim") {
			break
		}
		if i > 100000 {
			t.Fatal("victim never evicted")
		}
	}
	if !l.Allow("victim") {
		t.Fatal("evicted key did not come back fresh")
	}
}

func (t *table[C, P]) contains(key string) bool {
	fp, i := t.hash(key)
	sh := &t.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.find(fp) >= 0
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
