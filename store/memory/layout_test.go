package memory

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
)

// The tests in this file observe the tables' layout, not their answers: the
// conformance suite already pins every answer, but a table that probes too
// far, grows too much or forgets to reuse a dead slot answers the same and
// only costs memory or time. These invariants make such changes visible.

// shardView is one shard as the layout checks see it.
type shardView struct {
	fps   []uint64 // per slot; 0 is empty
	tomb  []bool   // per slot: a tombstone (word tables only)
	count int
}

type tableView struct {
	maxPer, maxSlots int
	shards           [numShards]shardView
}

func viewOf(t *testing.T, at anyTable) tableView {
	t.Helper()
	switch tb := at.(type) {
	case *wordTable:
		v := tableView{maxPer: tb.maxPer, maxSlots: tb.maxSlots}
		for i := range tb.shards {
			sh := &tb.shards[i]
			sh.mu.Lock()
			v.shards[i].count = sh.count
			if p := sh.slots.Load(); p != nil {
				for j := range *p {
					s := &(*p)[j]
					v.shards[i].fps = append(v.shards[i].fps, s.fp.Load())
					v.shards[i].tomb = append(v.shards[i].tomb, s.fp.Load() != 0 && s.word.Load() == frozen)
				}
			}
			sh.mu.Unlock()
		}
		return v
	case *table[fixedWindowCell, *fixedWindowCell]:
		return viewOfCells(tb)
	case *table[slidingWindowCell, *slidingWindowCell]:
		return viewOfCells(tb)
	case *table[slidingLogCell, *slidingLogCell]:
		return viewOfCells(tb)
	}
	t.Fatalf("no layout view for %T", at)
	return tableView{}
}

func viewOfCells[C any, P cellOps[C]](tb *table[C, P]) tableView {
	v := tableView{maxPer: tb.maxPer, maxSlots: tb.maxSlots}
	for i := range tb.shards {
		sh := &tb.shards[i]
		sh.mu.Lock()
		v.shards[i].count = sh.count
		for j := range sh.slots {
			v.shards[i].fps = append(v.shards[i].fps, sh.slots[j].fp)
			v.shards[i].tomb = append(v.shards[i].tomb, false)
		}
		sh.mu.Unlock()
	}
	return v
}

// checkLayout verifies every shard of a table: its slot count is 0 or a power
// of two between minSlots and maxSlots; count is the number of occupied slots
// and stays within both the shard's key bound and 3/4 of its slots; every
// key lies in the probe run that starts at its home slot (no empty slot
// between home and key, or a lookup would stop short and insert it twice);
// no live key is there twice. It returns the view for further checks.
func checkLayout(t *testing.T, at anyTable) tableView {
	t.Helper()
	v := viewOf(t, at)
	for i, sh := range v.shards {
		n := len(sh.fps)
		if n == 0 {
			if sh.count != 0 {
				t.Fatalf("shard %d: count %d with no slots", i, sh.count)
			}
			continue
		}
		if n&(n-1) != 0 || n < minSlots || n > v.maxSlots {
			t.Fatalf("shard %d: %d slots, want a power of two in [%d, %d]", i, n, minSlots, v.maxSlots)
		}
		occupied := 0
		live := map[uint64]bool{}
		for j, fp := range sh.fps {
			if fp == 0 {
				continue
			}
			occupied++
			if fp&1 == 0 || int(fp>>(64-shardBits)) != i {
				t.Fatalf("shard %d slot %d: fingerprint %#x is not a key of this shard", i, j, fp)
			}
			for k := home(fp, n); k != j; k = (k + 1) & (n - 1) {
				if sh.fps[k] == 0 {
					t.Fatalf("shard %d: key in slot %d is cut off from its home slot %d by an empty slot %d", i, j, home(fp, n), k)
				}
			}
			if !sh.tomb[j] {
				if live[fp] {
					t.Fatalf("shard %d: key %#x held twice", i, fp)
				}
				live[fp] = true
			}
		}
		if occupied != sh.count {
			t.Fatalf("shard %d: count %d, %d slots occupied", i, sh.count, occupied)
		}
		if sh.count > v.maxPer || sh.count > n*maxLoadNum/maxLoadDen {
			t.Fatalf("shard %d: %d keys in %d slots, bound %d per shard and 3/4 of the slots", i, sh.count, n, v.maxPer)
		}
	}
	return v
}

// tableOf returns the single table behind rule r.
func tableOf(t *testing.T, s *Store, r string) anyTable {
	t.Helper()
	entries := (*s.tables.Load())[r]
	if len(entries) != 1 {
		t.Fatalf("rule %q has %d tables", r, len(entries))
	}
	return entries[0].t
}

// keysInShard returns n distinct keys that all fall into shard 0 of a store
// whose tables use seed.
func keysInShard(seed maphash.Seed, prefix string, n int) []string {
	var keys []string
	for i := 0; len(keys) < n; i++ {
		k := fmt.Sprint(prefix, i)
		if maphash.String(seed, k)>>(64-shardBits) == 0 {
			keys = append(keys, k)
		}
	}
	return keys
}

var everyAlgorithm = []sluice.Algorithm{
	sluice.GCRA, sluice.TokenBucket, sluice.LeakyMeter, sluice.LeakyQueue,
	sluice.FixedWindow, sluice.SlidingWindow, sluice.SlidingLog,
}

// Random traffic on a few shards (inserts, takes, forgets, multi-key takes,
// pauses short and long, sweeps) keeps every layout invariant, and between
// sweeps a shard grows only as far as its keys need: to the size a rebuild
// of its keys would choose, or not at all. After a sweep every shard has
// exactly the size its keys need.
func TestLayoutStaysValidUnderRandomOperations(t *testing.T) {
	for _, alg := range everyAlgorithm {
		t.Run(alg.String(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(alg)))
			clock := sluice.NewManualClock(epoch)
			s := New(WithClock(clock), WithMaxKeys(numShards*40))
			lim := sluice.Limit{Rate: 4, Period: time.Second, Algorithm: alg}
			if alg.IsBucket() {
				lim.Burst = 6
			}
			l, err := s.Limiter("r", lim)
			if err != nil {
				t.Fatal(err)
			}
			keys := keysInShard(s.seed, "k", 120) // more than a shard's bound
			tb := tableOf(t, s, "r")
			prev := checkLayout(t, tb)
			ops := [6]int{}
			for step := range 4000 {
				k := keys[rng.IntN(len(keys))]
				op := rng.IntN(100)
				switch {
				case op < 70:
					l.Take(k, int64(rng.IntN(3)))
					ops[0]++
				case op < 78:
					s.Forget("r", k)
					ops[1]++
				case op < 86:
					ts := []sluice.Take{{Rule: "r", Key: k, Limit: lim, Cost: 2}, {Rule: "r", Key: keys[rng.IntN(len(keys))], Limit: lim, Cost: 5}}
					if err := s.Take(context.Background(), ts, make([]sluice.Decision, 2)); err != nil {
						t.Fatal(err)
					}
					ops[2]++
				case op < 95:
					clock.Advance(time.Duration(rng.IntN(300)) * time.Millisecond)
					ops[3]++
				case op < 98:
					clock.Advance(time.Duration(rng.IntN(100)) * time.Second)
					ops[4]++
				default:
					s.Sweep()
					v := checkLayout(t, tb)
					for i, sh := range v.shards {
						if len(prev.shards[i].fps) == 0 && len(sh.fps) != 0 {
							t.Fatalf("step %d: a sweep gave empty shard %d %d slots", step, i, len(sh.fps))
						}
						if want := sizeFor(sh.count, v.maxSlots); len(sh.fps) != 0 && len(sh.fps) != want {
							t.Fatalf("step %d: after a sweep shard %d has %d slots for %d keys, want %d", step, i, len(sh.fps), sh.count, want)
						}
					}
					prev = v
					ops[5]++
					continue
				}
				v := checkLayout(t, tb)
				for i, sh := range v.shards {
					was, now := len(prev.shards[i].fps), len(sh.fps)
					if now < was {
						t.Fatalf("step %d: shard %d shrank from %d to %d slots without a sweep", step, i, was, now)
					}
					if now > was && now > max(minSlots, sizeFor(sh.count, v.maxSlots)) {
						t.Fatalf("step %d: shard %d grew from %d to %d slots for %d keys", step, i, was, now, sh.count)
					}
				}
				prev = v
			}
			for i, n := range ops {
				if n == 0 {
					t.Fatalf("operation %d never ran: the mix does not test it", i)
				}
			}
			if got := len(prev.shards[0].fps); got < 32 {
				t.Fatalf("shard 0 never grew past %d slots: the test did not fill it", got)
			}
		})
	}
}

// slotOf returns the slot index of key in its shard, or -1.
func slotOf(t *testing.T, at anyTable, key string) (shard, slot int) {
	t.Helper()
	fp, sh := at.locate(key)
	v := viewOf(t, at)
	for i, f := range v.shards[sh].fps {
		if f == fp && !v.shards[sh].tomb[i] {
			return sh, i
		}
	}
	return sh, -1
}

// A new key takes the first dead slot on its probe path (implicit expiry):
// the shard holds no more keys than before, and a dead slot at index 0
// counts like any other.
func TestNewKeyTakesTheFirstDeadSlotOnItsPath(t *testing.T) {
	for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindow, sluice.SlidingLog} {
		t.Run(alg.String(), func(t *testing.T) {
			clock := sluice.NewManualClock(epoch)
			s := New(WithClock(clock))
			l, _ := s.Limiter("r", sluice.Limit{Rate: 1, Period: time.Second, Algorithm: alg})
			tb := tableOf(t, s, "r")
			var path []string // keys of shard 0 whose home is slot 0 of an 8-slot shard
			for _, k := range keysInShard(s.seed, "k", 400) {
				if fp, _ := tb.locate(k); home(fp, minSlots) == 0 {
					path = append(path, k)
				}
			}
			if len(path) < 3 {
				t.Fatalf("only %d keys with home slot 0", len(path))
			}
			a, c, b := path[0], path[1], path[2]
			l.Allow(a)
			l.Allow(c)
			if _, i := slotOf(t, tb, a); i != 0 {
				t.Fatalf("first key in slot %d, want 0", i)
			}
			if _, i := slotOf(t, tb, c); i != 1 {
				t.Fatalf("second key in slot %d, want 1", i)
			}
			clock.Advance(10 * time.Second) // both dead
			l.Allow(b)
			if _, i := slotOf(t, tb, b); i != 0 {
				t.Fatalf("new key in slot %d, want the first dead slot on its path, 0", i)
			}
			if n := checkLayout(t, tb).shards[0].count; n != 2 {
				t.Fatalf("shard holds %d slots after reusing a dead one, want 2", n)
			}
		})
	}
}

// A shard found full of limited keys sends new keys to the overflow state
// for fullRetry without rebuilding, even if a key has recovered meanwhile,
// then rebuilds and finds room: a flood of new keys costs one rebuild per
// fullRetry, and the shard does not stay closed longer than that.
func TestFullShardLooksAgainAfterFullRetry(t *testing.T) {
	// The recovered key must not be dead, or a new key whose probe passes
	// its slot would simply reuse it: for the sliding log it keeps one of
	// its two entries. (The word table never reuses a slot outside a
	// rebuild, so one unit will do for GCRA.)
	for _, tc := range []struct {
		alg  sluice.Algorithm
		rate int64
	}{{sluice.GCRA, 1}, {sluice.SlidingLog, 2}} {
		t.Run(tc.alg.String(), func(t *testing.T) {
			clock := sluice.NewManualClock(epoch)
			s := New(WithClock(clock), WithMaxKeys(numShards*4)) // four keys per shard
			lim := sluice.Limit{Rate: tc.rate, Period: 100 * time.Millisecond, Algorithm: tc.alg}
			l, _ := s.Limiter("r", lim)
			keys := keysInShard(s.seed, "k", 7)
			overflows := func() uint64 { return s.Stats()[0].Overflows }
			for i := range tc.rate { // at +0 (and +60ms): limited until +100ms
				clock.Advance(time.Duration(min(i, 1)) * 60 * time.Millisecond)
				l.Allow(keys[0])
			}
			clock.Advance(90*time.Millisecond - time.Duration(tc.rate-1)*60*time.Millisecond)
			for _, k := range keys[1:4] { // at +90ms: limited until +190ms
				if _, err := l.Take(k, tc.rate); err != nil {
					t.Fatal(err)
				}
			}
			l.Allow(keys[4]) // the shard is full of limited keys
			if got := overflows(); got != 1 {
				t.Fatalf("%d overflows, want 1: the fifth key of a full shard", got)
			}
			clock.Advance(20 * time.Millisecond) // keys[0] has recovered
			if d, _ := l.Take(keys[0], 0); d.Remaining == 0 {
				t.Fatal("the first key has not recovered")
			}
			l.Allow(keys[5])
			if got := overflows(); got != 2 {
				t.Fatalf("%d overflows, want 2: within fullRetry a new key goes to the overflow state", got)
			}
			clock.Advance(time.Duration(fullRetry) - 20*time.Millisecond) // exactly fullRetry after the shard was found full
			l.Allow(keys[6])
			if got := overflows(); got != 2 {
				t.Fatalf("%d overflows, want 2: after fullRetry the shard rebuilds and evicts the recovered key", got)
			}
			if _, i := slotOf(t, tableOf(t, s, "r"), keys[6]); i < 0 {
				t.Fatal("the new key has no slot of its own")
			}
		})
	}
}

// lockOrder sorts the shards a multi-key take locks by table and shard and
// locks each once, whatever the order of the takes: two takes that name the
// same shards in different orders cannot deadlock, and a take that names a
// shard twice does not lock it twice.
func TestLockOrderIsSortedAndDistinct(t *testing.T) {
	s := New()
	var ts [2]anyTable
	for i := range ts {
		var err error
		if ts[i], err = s.table(fmt.Sprint("r", i), gcraLimit()); err != nil {
			t.Fatal(err)
		}
	}
	a, b := ts[0].meta().id, ts[1].meta().id
	ps := []pending{{t: ts[1], shard: 5}, {t: ts[0], shard: 9}, {t: ts[1], shard: 3}, {t: ts[0], shard: 9}, {t: ts[1], shard: 5}, {t: ts[0], shard: 0}, {t: ts[1], shard: 4}}
	var got []string
	for _, r := range lockOrder(ps, nil) {
		got = append(got, fmt.Sprint(r.id, "/", r.shard))
	}
	want := []string{fmt.Sprint(a, "/0"), fmt.Sprint(a, "/9"), fmt.Sprint(b, "/3"), fmt.Sprint(b, "/4"), fmt.Sprint(b, "/5")}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("lock order %v, want %v", got, want)
	}
}

// A shard at its size bound drops its dead keys when it rebuilds (implicit
// expiry) instead of evicting them: no eviction is counted, and the live key
// the rebuild was for gets a slot.
func TestFullSizeRebuildDropsDeadKeysWithoutEviction(t *testing.T) {
	for _, alg := range everyAlgorithm {
		t.Run(alg.String(), func(t *testing.T) {
			clock := sluice.NewManualClock(epoch)
			s := New(WithClock(clock), WithMaxKeys(numShards*4)) // four keys, eight slots per shard
			l, _ := s.Limiter("r", sluice.Limit{Rate: 1, Period: time.Second, Algorithm: alg})
			keys := keysInShard(s.seed, "k", 200)
			for _, k := range keys[:4] {
				l.Allow(k)
			}
			tb := tableOf(t, s, "r")
			v := checkLayout(t, tb)
			if n := len(v.shards[0].fps); n != v.maxSlots {
				t.Fatalf("shard has %d slots, want its bound %d", n, v.maxSlots)
			}
			clock.Advance(time.Hour) // all four dead
			// A new key whose home slot is empty meets no dead key on its
			// path, so the shard, at its key bound, must rebuild.
			var next string
			for _, k := range keys[4:] {
				if fp, _ := tb.locate(k); v.shards[0].fps[home(fp, len(v.shards[0].fps))] == 0 {
					next = k
					break
				}
			}
			if next == "" {
				t.Fatal("no key with an empty home slot")
			}
			l.Allow(next)
			if ev := s.Stats()[0].Evictions; ev != 0 {
				t.Fatalf("%d evictions: the rebuild evicted dead keys instead of dropping them", ev)
			}
			if n := checkLayout(t, tb).shards[0].count; n != 1 {
				t.Fatalf("shard holds %d keys after the rebuild, want only the new one", n)
			}
		})
	}
}

// A sweep drops a key of the one-word algorithms from the very instant it is
// idle again, and not one nanosecond before: one unit taken from a fresh key
// at t is given back at t + Period/Rate.
func TestSweepDropsAKeyFromItsIdleInstant(t *testing.T) {
	for _, alg := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyMeter, sluice.LeakyQueue} {
		t.Run(alg.String(), func(t *testing.T) {
			clock := sluice.NewManualClock(epoch)
			s := New(WithClock(clock))
			lim := sluice.Limit{Rate: 4, Period: time.Second, Algorithm: alg}
			l, _ := s.Limiter("r", lim)
			l.Allow("k")
			keys := func() int { s.Sweep(); k, _ := keysOf(s); return k }
			clock.Advance(lim.Period/time.Duration(lim.Rate) - 1)
			if n := keys(); n != 1 {
				t.Fatalf("a sweep 1ns before the key is idle left %d keys, want 1", n)
			}
			clock.Advance(1)
			if n := keys(); n != 0 {
				t.Fatalf("a sweep at the instant the key is idle left %d keys, want 0", n)
			}
		})
	}
}

// Forget finds and removes a key wherever it sits, slot 0 included.
func TestForgetRemovesAKeyInSlotZero(t *testing.T) {
	for _, alg := range everyAlgorithm {
		t.Run(alg.String(), func(t *testing.T) {
			s := New(WithClock(sluice.NewManualClock(epoch)))
			l, _ := s.Limiter("r", sluice.Limit{Rate: 1, Period: time.Hour, Algorithm: alg})
			tb := tableOf(t, s, "r")
			var key string
			for _, k := range keysInShard(s.seed, "k", 400) {
				if fp, _ := tb.locate(k); home(fp, minSlots) == 0 {
					key = k
					break
				}
			}
			l.Allow(key)
			if _, i := slotOf(t, tb, key); i != 0 {
				t.Fatalf("key in slot %d, want 0", i)
			}
			if !s.Forget("r", key) {
				t.Fatal("Forget did not find the key in slot 0")
			}
			if _, i := slotOf(t, tb, key); i >= 0 {
				t.Fatalf("key still in slot %d after Forget", i)
			}
			if !l.Allow(key) {
				t.Fatal("a forgotten key is still limited")
			}
		})
	}
}
