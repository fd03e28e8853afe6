package share

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestHotKeysSpaceSaving checks the space-saving guarantees on skewed random
// traffic against exact counts: the counts sum to the decisions seen, no key
// is ever under-counted, over-counted by more than total/Cap, or missing if it
// had more than total/Cap; and the heap and its index agree after every step.
func TestHotKeysSpaceSaving(t *testing.T) {
	for seed := range uint64(20) {
		r := rand.New(rand.NewPCG(seed, 7))
		capacity := 1 + r.IntN(40)
		h := NewHotKeys(capacity, time.Hour)
		zipf := rand.NewZipf(r, 1.2, 1, 500)
		exact := map[string]int64{}
		var total int64
		const now = int64(1) // within the first second: a rate is a count
		for step := range 3000 {
			k := fmt.Sprint("k", zipf.Uint64())
			n := int64(1 + r.IntN(3))
			h.ObserveN("rule", k, now, n)
			exact[k] += n
			total += n
			for i, c := range h.cur {
				if h.at[c.k] != i {
					t.Fatalf("seed %d step %d: %v is at %d, indexed at %d", seed, step, c.k, i, h.at[c.k])
				}
				if l := 2*i + 1; l < len(h.cur) && h.cur[l].n < c.n || l+1 < len(h.cur) && h.cur[l+1].n < c.n {
					t.Fatalf("seed %d step %d: not a min-heap at %d", seed, step, i)
				}
			}
			if len(h.at) != len(h.cur) || len(h.cur) > capacity {
				t.Fatalf("seed %d step %d: %d indexed, %d held, cap %d", seed, step, len(h.at), len(h.cur), capacity)
			}
		}
		held := map[string]int64{}
		var sum int64
		for _, x := range h.Top(capacity, 0, now) {
			held[x.Key] = int64(math.Round(x.Rate))
			sum += int64(math.Round(x.Rate))
		}
		if sum != total {
			t.Fatalf("seed %d: counts sum to %d, %d decisions seen", seed, sum, total)
		}
		for k, c := range held {
			if c < exact[k] || c-exact[k] > total/int64(capacity) {
				t.Fatalf("seed %d: %s counted %d, exactly %d (bound %d)", seed, k, c, exact[k], total/int64(capacity))
			}
		}
		for k, c := range exact {
			if _, ok := held[k]; !ok && c > total/int64(capacity) {
				t.Fatalf("seed %d: %s with %d of %d decisions (cap %d) is not held", seed, k, c, total, capacity)
			}
		}
	}
}

// TestHotKeysWindows: a key's rate is its count in the last whole window
// when the current one is lower.
func TestHotKeysWindows(t *testing.T) {
	h := NewHotKeys(4, 10*time.Second)
	sec := int64(time.Second)
	for i := range 100 {
		h.Observe("r", "a", sec+int64(i)*sec/10) // 10/s for 10 s
	}
	if got := h.Observe("r", "a", 11*sec+1); got < 9.9 || got > 10.1 {
		t.Fatalf("rate after the window = %v, want about 10 (the last window's)", got)
	}
	if got := h.Observe("r", "b", 11*sec+2); got != 1 {
		t.Fatalf("a new key's rate = %v, want 1", got)
	}
}

// A window ends to the nanosecond: an observation at start + window opens
// the next one, and the key's rate is then the higher of the new window's
// (1 in its first second) and the last whole window's (5 in 10 s). Top
// lists the keys at or above the rate asked, hottest first, at most n.
func TestHotKeysWindowEdgeAndTop(t *testing.T) {
	sec := int64(time.Second)
	h := NewHotKeys(8, 10*time.Second)
	for i := range 5 {
		if got := h.Observe("r", "a", sec); got != float64(i+1) {
			t.Fatalf("observation %d in the window's first second: rate %v, want %d", i+1, got, i+1)
		}
	}
	if got := h.Observe("r", "a", 11*sec); got != 1 {
		t.Fatalf("at the window's end: rate %v, want 1 (a new window began)", got)
	}
	h2 := NewHotKeys(8, time.Hour)
	for i, n := range []int64{3, 7, 5} {
		h2.ObserveN("r", fmt.Sprint("k", i), sec, n)
	}
	top := h2.Top(2, 5, sec)
	if len(top) != 2 || top[0].Key != "k1" || top[0].Rate != 7 || top[1].Key != "k2" || top[1].Rate != 5 {
		t.Fatalf("Top(2, 5): %+v, want k1 at 7 then k2 at 5 (at the rate asked, included)", top)
	}
	if top := h2.Top(1, 0, sec); len(top) != 1 || top[0].Key != "k1" {
		t.Fatalf("Top(1, 0): %+v, want the hottest only", top)
	}
}

// Windows are measured from their start, whatever the clock reads: at a
// wall-clock instant, decisions in the same second add up.
func TestHotKeysAtAWallClockInstant(t *testing.T) {
	h := NewHotKeys(4, 10*time.Second)
	now := epoch.UnixNano()
	for i := range 3 {
		if got := h.Observe("r", "a", now); got != float64(i+1) {
			t.Fatalf("observation %d at %v: rate %v, want %d", i+1, epoch, got, i+1)
		}
	}
	if top := h.Top(2, 0, now); len(top) != 1 || top[0].Rate != 3 {
		t.Fatalf("Top: %+v, want a at 3/s", top)
	}
}

// A window of 0 is taken as 1 ns: rates stay finite.
func TestHotKeysWithAZeroWindow(t *testing.T) {
	h := NewHotKeys(4, 0)
	now := epoch.UnixNano()
	h.Observe("r", "a", now)
	if got := h.Observe("r", "a", now); math.IsInf(got, 0) || math.IsNaN(got) {
		t.Fatalf("rate %v", got)
	}
	for _, hot := range h.Top(4, 0, now) {
		if math.IsInf(hot.Rate, 0) || math.IsNaN(hot.Rate) {
			t.Fatalf("Top: %+v", hot)
		}
	}
}
