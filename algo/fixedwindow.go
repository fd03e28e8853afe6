package algo

// FixedWindow is the state of a fixed window counter: the start of the window
// it counts and the units counted in it. Windows are W long and aligned to
// the Unix epoch (a 1m window runs from :00 to :59 of each minute, a 1d window
// from midnight UTC), or follow the UTC calendar (see Params.window). The
// zero value is a fresh key.
//
// A take of cost c is allowed iff count + c <= L in now's window; the count
// starts from 0 in each new window. On rejection RetryAfter is the time left
// in the window, when the count resets. ResetAfter is the same while anything
// is counted; Remaining = L - count. Across a window boundary up to 2L units
// can pass within a short interval, and every key rejected in a window comes
// back at the same instant: the two known flaws of this algorithm.
type FixedWindow struct {
	Start int64 // start of the counted window
	Count int64
}

// Take decides a take of cost units at now.
func (s FixedWindow) Take(p *Params, now, cost int64, r *Result) FixedWindow {
	if start, _ := p.window(now); start > s.Start {
		s = FixedWindow{Start: start}
	} else if start < s.Start {
		now = s.Start // time went back into an earlier window: no time has elapsed
	}
	_, end := p.window(s.Start)
	left := end - now
	reset := left
	if s.Count == 0 {
		reset = 0
	}
	if cost == 0 {
		if s.Count > p.Burst { // in debt: over the limit until the window ends
			*r = limited(0, left, reset)
		} else {
			*r = allowed(p.Burst-s.Count, reset)
		}
		return s
	}
	if cost > p.Burst {
		*r = tooLarge(p.Burst-s.Count, reset)
		return s
	}
	if cost > p.Burst-s.Count { // not Count+cost: a charged Count may be near MaxInt64
		*r = limited(p.Burst-s.Count, left, reset)
		return s
	}
	s.Count += cost
	*r = allowed(p.Burst-s.Count, left)
	return s
}

// Idle reports whether nothing is counted in now's window.
func (s FixedWindow) Idle(p *Params, now int64) bool {
	start, _ := p.window(now)
	return s.Count == 0 || start > s.Start
}
