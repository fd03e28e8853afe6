package algo

// SlidingWindow is the state of a sliding window counter: the start of the
// current aligned window (W long, aligned to the Unix epoch), the count of the
// window before it and the count of the current one. The zero value is a fresh
// key.
//
// The estimate assumes the previous window's units were spread evenly: with e
// the time elapsed in the current window, estimate = prev*(W-e)/W + cur. A
// cost-c take is c units arriving at once, each admitted iff the estimate
// including the ones before it is below L, so it is allowed iff
//
//	prev*(W-e) + (cur + c - 1)*W < L*W,
//
// compared exactly in 128-bit integers. For c = 1 this is the textbook
// "estimate < limit". On rejection RetryAfter is the earliest instant the
// inequality holds, as prev's weight falls and the windows roll. Remaining is
// the largest cost allowed now; ResetAfter the time until both counts have
// left the estimate.
type SlidingWindow struct {
	Start int64 // start of the current window
	Prev  int64 // units counted in the window before Start
	Cur   int64 // units counted since Start
}

// Take decides a take of cost units at now.
func (s SlidingWindow) Take(p *Params, now, cost int64, r *Result) SlidingWindow {
	s, now = s.roll(p, now)
	e := now - s.Start
	remaining := s.admissible(p, e)
	reset := s.resetAfter(p, now)
	if cost == 0 {
		if s.over(p, e) { // in debt: over the limit until the estimate is back to L
			*r = limited(0, s.overFor(p, e), reset)
		} else {
			*r = allowed(remaining, reset)
		}
		return s
	}
	if cost > p.Burst {
		*r = tooLarge(remaining, reset)
		return s
	}
	if cost > remaining {
		*r = limited(remaining, s.retryAfter(p, e, cost), reset)
		return s
	}
	s.Cur += cost
	*r = allowed(s.admissible(p, e), s.resetAfter(p, now))
	return s
}

// roll moves the state to now's window. A now before Start (time went back)
// is taken as Start: no time has elapsed.
func (s SlidingWindow) roll(p *Params, now int64) (SlidingWindow, int64) {
	start := windowStart(now, p.W)
	switch {
	case start < s.Start:
		return s, s.Start
	case start == s.Start:
		return s, now
	case start == AddSat(s.Start, p.W):
		return SlidingWindow{Start: start, Prev: s.Cur}, now
	default:
		return SlidingWindow{Start: start}, now
	}
}

// admissible returns the largest cost k allowed at elapsed e: the largest k
// with prev*(W-e) + (cur+k-1)*W < L*W, that is ceil(X/W) for
// X = L*W - prev*(W-e) - cur*W, or 0 when X <= 0.
func (s SlidingWindow) admissible(p *Params, e int64) int64 {
	used := mul(s.Prev, p.W-e).add(mul(s.Cur, p.W))
	total := mul(p.Burst, p.W)
	if !used.less(total) {
		return 0
	}
	x := total.sub(used)
	k := x.divCapped(p.W, p.Burst)
	if x.sub(mul(k, p.W)).isZero() {
		return k
	}
	return k + 1
}

// retryAfter returns the time from elapsed e until a cost (<= L) is allowed.
func (s SlidingWindow) retryAfter(p *Params, e, cost int64) int64 {
	// Later in this window: need prev*(W-e') < a*W with a = L - cur - cost + 1,
	// i.e. W - e' <= floor((a*W - 1) / prev).
	if a := p.Burst - s.Cur - cost + 1; a > 0 && s.Prev > 0 {
		if at := p.W - mul(a, p.W).sub(u128{lo: 1}).divCapped(s.Prev, p.W); at < p.W {
			return at - e
		}
	}
	// In the next window cur becomes prev: need cur*(W-e'') < (L-cost+1)*W.
	toNext := p.W - e
	if s.Cur == 0 {
		return toNext
	}
	at := p.W - mul(p.Burst-cost+1, p.W).sub(u128{lo: 1}).divCapped(s.Cur, p.W)
	if at < p.W {
		return toNext + max(at, 0)
	}
	return toNext + p.W // two windows on, both counts are gone
}

// over reports whether the estimate at elapsed e is above L (only a charge
// takes it there): prev*(W-e) + cur*W > L*W.
func (s SlidingWindow) over(p *Params, e int64) bool {
	return mul(p.Burst, p.W).less(mul(s.Prev, p.W-e).add(mul(s.Cur, p.W)))
}

// overFor returns the time from elapsed e until an estimate above L is back
// to at most L.
func (s SlidingWindow) overFor(p *Params, e int64) int64 {
	// Later in this window: need prev*(W-e') <= (L-cur)*W, i.e.
	// W - e' <= floor((L-cur)*W / prev).
	if s.Cur <= p.Burst && s.Prev > 0 {
		if at := p.W - mul(p.Burst-s.Cur, p.W).divCapped(s.Prev, p.W); at < p.W {
			return at - e
		}
	}
	// In the next window cur becomes prev: need cur*(W-e'') <= L*W.
	toNext := p.W - e
	if s.Cur <= p.Burst {
		return toNext
	}
	return toNext + p.W - mul(p.Burst, p.W).divCapped(s.Cur, p.W)
}

func (s SlidingWindow) resetAfter(p *Params, now int64) int64 {
	switch {
	case s.Cur > 0:
		return AddSat(s.Start, 2*p.W) - now
	case s.Prev > 0:
		return AddSat(s.Start, p.W) - now
	}
	return 0
}

// Idle reports whether both counts have left the estimate at now.
func (s SlidingWindow) Idle(p *Params, now int64) bool {
	s, _ = s.roll(p, now)
	return s.Prev == 0 && s.Cur == 0
}
