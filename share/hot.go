package share

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"time"
)

// HotKeys finds each process's heavy hitters among (rule, key) pairs by
// decisions per second, with the space-saving algorithm (Metwally et al.,
// 2005): it keeps at most Cap counters; a new key takes the place of the
// smallest one and starts from its count, so a key's count is at most over,
// never under, by the count it inherited, and any key with more than
// 1/Cap of the decisions is always held. Counts are kept per window (10 s
// by default): a key's rate is its count in the last whole window, or in the
// current one if that is higher already.
//
// The counters are a min-heap with an index by key, so the smallest is found
// in O(1) and a count moves in O(log Cap): observing a key is O(log Cap)
// whether or not it is held, as the paper's stream-summary structure is O(1).
type HotKeys struct {
	mu     sync.Mutex
	cap    int
	window int64
	start  int64
	cur    []hotCount     // a min-heap by count
	at     map[hotKey]int // each held key's place in cur
	prev   map[hotKey]int64
	span   int64 // the previous window's length
}

type hotKey struct{ rule, key string }

type hotCount struct {
	k hotKey
	n int64
}

// Hot is one heavy hitter.
type Hot struct {
	Rule, Key string
	// Rate is its decisions per second (an upper bound: see HotKeys).
	Rate float64
}

// NewHotKeys returns a tracker of at most cap keys per window.
func NewHotKeys(cap int, window time.Duration) *HotKeys {
	cap, window = max(cap, 1), max(window, 1) // a window of at least 1 ns: a rolled one has a length to divide by
	return &HotKeys{cap: cap, window: int64(window), at: make(map[hotKey]int, cap), prev: map[hotKey]int64{}}
}

// Observe counts one decision for (rule, key) at now and returns its rate.
func (h *HotKeys) Observe(rule, key string, now int64) float64 { return h.ObserveN(rule, key, now, 1) }

// ObserveN counts n decisions at once, for a caller that samples 1 in n.
func (h *HotKeys) ObserveN(rule, key string, now int64, n64 int64) float64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.start == 0 {
		h.start = now
	}
	if now-h.start >= h.window {
		h.prev, h.span = make(map[hotKey]int64, len(h.cur)), now-h.start
		for _, c := range h.cur {
			h.prev[c.k] = c.n
		}
		h.cur, h.start = h.cur[:0], now
		clear(h.at)
	}
	k := hotKey{rule, key}
	i, ok := h.at[k]
	if !ok {
		k.rule, k.key = strings.Clone(rule), strings.Clone(key)
		if len(h.cur) < h.cap {
			i = len(h.cur)
			h.cur = append(h.cur, hotCount{k: k})
		} else {
			// The smallest gives its place, and its count, to the new key.
			i = 0
			delete(h.at, h.cur[0].k)
			h.cur[0].k = k
		}
		h.at[k] = i
	}
	h.cur[i].n += n64
	n := h.cur[i].n
	h.up(i) // a new leaf may be smaller than its parent
	h.down(i)
	rate := float64(n) / float64(max(now-h.start, int64(time.Second))) * float64(time.Second)
	if h.span > 0 { // a window has rolled: the last one's count holds too
		rate = max(rate, float64(h.prev[k])/float64(h.span)*float64(time.Second))
	}
	return rate
}

// up moves cur[i] toward the root while it is smaller than its parent.
func (h *HotKeys) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if h.cur[p].n <= h.cur[i].n {
			return
		}
		h.cur[i], h.cur[p] = h.cur[p], h.cur[i]
		h.at[h.cur[i].k], h.at[h.cur[p].k] = i, p
		i = p
	}
}

// down restores the heap after cur[i]'s count grew.
func (h *HotKeys) down(i int) {
	for {
		l, small := 2*i+1, i
		if l < len(h.cur) && h.cur[l].n < h.cur[small].n {
			small = l
		}
		if r := l + 1; r < len(h.cur) && h.cur[r].n < h.cur[small].n {
			small = r
		}
		if small == i {
			return
		}
		h.cur[i], h.cur[small] = h.cur[small], h.cur[i]
		h.at[h.cur[i].k], h.at[h.cur[small].k] = i, small
		i = small
	}
}

// Top returns up to n keys at least minRate decisions per second, hottest
// first.
func (h *HotKeys) Top(n int, minRate float64, now int64) []Hot {
	h.mu.Lock()
	defer h.mu.Unlock()
	rates := map[hotKey]float64{}
	for k, c := range h.prev { // empty until a window rolls, which sets span >= window
		rates[k] = float64(c) / float64(h.span) * float64(time.Second)
	}
	elapsed := max(now-h.start, int64(time.Second))
	for _, c := range h.cur {
		rates[c.k] = max(rates[c.k], float64(c.n)/float64(elapsed)*float64(time.Second))
	}
	var out []Hot
	for k, r := range rates {
		if r >= minRate {
			out = append(out, Hot{Rule: k.rule, Key: k.key, Rate: r})
		}
	}
	// Hottest first; equal rates by rule and key, so that the list reads
	// the same from one call to the next.
	slices.SortFunc(out, func(a, b Hot) int {
		return cmp.Or(cmp.Compare(b.Rate, a.Rate), strings.Compare(a.Rule, b.Rule), strings.Compare(a.Key, b.Key))
	})
	return out[:min(n, len(out))]
}
