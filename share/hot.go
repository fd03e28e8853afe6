package share

import (
	"sort"
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
type HotKeys struct {
	mu     sync.Mutex
	cap    int
	window int64
	start  int64
	cur    map[hotKey]int64
	prev   map[hotKey]int64
	span   int64 // the previous window's length
}

type hotKey struct{ rule, key string }

// Hot is one heavy hitter.
type Hot struct {
	Rule, Key string
	// Rate is its decisions per second (an upper bound: see HotKeys).
	Rate float64
}

// NewHotKeys returns a tracker of at most cap keys per window.
func NewHotKeys(cap int, window time.Duration) *HotKeys {
	return &HotKeys{cap: cap, window: int64(window), cur: map[hotKey]int64{}, prev: map[hotKey]int64{}}
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
		h.prev, h.span = h.cur, now-h.start
		h.cur, h.start = make(map[hotKey]int64, h.cap), now
	}
	k := hotKey{rule, key}
	n, ok := h.cur[k]
	switch {
	case ok:
	case len(h.cur) < h.cap:
		k.rule, k.key = strings.Clone(rule), strings.Clone(key)
	default:
		var minK hotKey
		first := true
		for k2, c := range h.cur {
			if first || c < n {
				minK, n, first = k2, c, false
			}
		}
		delete(h.cur, minK)
		k.rule, k.key = strings.Clone(rule), strings.Clone(key)
	}
	n += n64
	h.cur[k] = n
	rate := float64(n) / float64(max(now-h.start, int64(time.Second))) * float64(time.Second)
	if p := h.prev[k]; p > 0 && h.span > 0 {
		rate = max(rate, float64(p)/float64(h.span)*float64(time.Second))
	}
	return rate
}

// Top returns up to n keys at least minRate decisions per second, hottest
// first.
func (h *HotKeys) Top(n int, minRate float64, now int64) []Hot {
	h.mu.Lock()
	defer h.mu.Unlock()
	rates := map[hotKey]float64{}
	if h.span > 0 {
		for k, c := range h.prev {
			rates[k] = float64(c) / float64(h.span) * float64(time.Second)
		}
	}
	elapsed := max(now-h.start, int64(time.Second))
	for k, c := range h.cur {
		rates[k] = max(rates[k], float64(c)/float64(elapsed)*float64(time.Second))
	}
	var out []Hot
	for k, r := range rates {
		if r >= minRate {
			out = append(out, Hot{Rule: k.rule, Key: k.key, Rate: r})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rate > out[j].Rate })
	if len(out) > n {
		out = out[:n]
	}
	return out
}
