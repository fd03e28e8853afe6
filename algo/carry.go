package algo

import "math"

// A key's limit can change while it holds state: an operator's override set
// or ended, a rule file reloaded, an xDS update. Carry converts the state
// kept under the old limit's Params (from) to the new one's (to) at now, so
// that what the key spent stays spent: the change never hands the key a
// fresh allowance, and never takes away more than it used.
//
//   - GCRA and the leaky queue keep a backlog (TAT or next departure - now)
//     of u units times T; it becomes u units times the new T:
//     backlog' = ceil(backlog * T_to / T_from).
//   - The token bucket and the leaky meter keep the spent part of the bucket
//     (D - tokens, or the level) the same way: spent' = ceil(spent * T_to /
//     T_from), tokens' = D_to - spent', below 0 (a debt) when the key spent
//     more than the new burst.
//   - The fixed window keeps its count if its window holds now, in the new
//     limit's window holding now; a count from an earlier window is gone.
//   - The sliding window keeps both counts when the window length is the
//     same; otherwise the estimate at now, rounded up, is counted in the new
//     window holding now.
//   - The sliding log keeps the entries that both windows still hold, more
//     than the new limit if the key spent more: it is then over the limit
//     until enough have left.
//
// Rounding is up, so a carried key is never emptier than the units it
// spent. The functions assume from and to are of the same algorithm.

// scaleUp returns ceil(x * num / den) for x >= 0, num, den > 0, saturated
// far below the int64 range so that later sums stay in it.
func scaleUp(x, num, den int64) int64 {
	if x <= 0 {
		return 0
	}
	const most = math.MaxInt64 / 4
	p := mul(x, num).add(u128{lo: uint64(den - 1)})
	return p.divCapped(den, most)
}

// Carry converts a GCRA state kept under from to to at now.
func (s GCRA) Carry(from, to *Params, now int64) GCRA {
	if s.TAT <= now {
		return s // nothing spent: idle under any limit
	}
	return GCRA{TAT: AddSat(now, scaleUp(SubSat(s.TAT, now), to.T, from.T))}
}

// Carry converts a leaky queue's state kept under from to to at now.
func (s LeakyQueue) Carry(from, to *Params, now int64) LeakyQueue {
	if s.Next <= now {
		return s
	}
	return LeakyQueue{Next: AddSat(now, scaleUp(SubSat(s.Next, now), to.T, from.T))}
}

// Carry converts a token bucket kept under from to to at now.
func (s TokenBucket) Carry(from, to *Params, now int64) TokenBucket {
	s = s.refill(from, now)
	spent := scaleUp(SubSat(from.D, s.Tokens), to.T, from.T)
	return TokenBucket{Tokens: to.D - spent, Last: max(now, s.Last)}
}

// Carry converts a leaky meter kept under from to to at now.
func (s LeakyMeter) Carry(from, to *Params, now int64) LeakyMeter {
	s = s.drain(now)
	return LeakyMeter{Level: scaleUp(s.Level, to.T, from.T), Last: max(now, s.Last)}
}

// Carry converts a fixed window's state kept under from to to at now.
func (s FixedWindow) Carry(from, to *Params, now int64) FixedWindow {
	start, end := from.window(max(now, s.Start))
	if s.Count == 0 || start != s.Start || now >= end {
		return FixedWindow{} // nothing counted in a window that holds now
	}
	if from.W == to.W && from.Calendar == to.Calendar {
		return s
	}
	ns, _ := to.window(now)
	return FixedWindow{Start: ns, Count: s.Count}
}

// Carry converts a sliding window's state kept under from to to at now.
func (s SlidingWindow) Carry(from, to *Params, now int64) SlidingWindow {
	if from.W == to.W {
		return s
	}
	s, now = s.roll(from, now)
	e := now - s.Start
	// estimate*W = prev*(W-e) + cur*W, rounded up to whole units.
	est := mul(s.Prev, from.W-e).add(mul(s.Cur, from.W)).add(u128{lo: uint64(from.W - 1)}).divCapped(from.W, math.MaxInt64/4)
	if est == 0 {
		return SlidingWindow{}
	}
	return SlidingWindow{Start: windowStart(now, to.W), Cur: est}
}

// Carry converts a sliding log kept under from to to at now, in place.
func (s *SlidingLog) Carry(from, to *Params, now int64) {
	now = s.expire(from, now) // what has left the old window is gone
	if s.n == 0 {
		return
	}
	cutoff := SubSat(now, to.W)
	keep := 0
	for i := s.n - 1; i >= 0 && s.at(i) > cutoff; i-- {
		keep++
	}
	s.head = (s.head + s.n - keep) % len(s.buf)
	s.n = keep
	if keep == 0 {
		s.head = 0
	}
}
