package algo

import "github.com/sluice-rl/sluice"

// Charges take units whatever the limit says: the part of a reservation's
// real cost beyond its estimate, known only once the work is done (see
// sluice.Take.Hold). The work has happened, so the units are owed: a charge
// beyond what the key has left puts it into debt, and later takes are
// refused until the debt is paid off at the limit's rate, exactly as if the
// estimate had been right.
//
// Debt lives in the state each algorithm already has: a GCRA TAT or a leaky
// queue's next departure further in the future, a token bucket holding fewer
// than zero tokens, a leaky meter above its capacity, a window counting more
// than its limit. A window forgets its count when it passes, so the debt of
// a window algorithm lasts until then (for the sliding window counter, until
// its estimate has rolled out); a sliding log logs at most L entries, so its
// debt is at most one full window.

// mulSat returns a*b for a >= 0, b > 0, saturated to MaxInt64.
func mulSat(a, b int64) int64 {
	if a > 0 && a > (1<<63-1)/b {
		return 1<<63 - 1
	}
	return a * b
}

// Charge takes units from a GCRA key at now, beyond its limit if need be.
func (s GCRA) Charge(p *Params, now, units int64) GCRA {
	return GCRA{TAT: AddSat(max(s.TAT, now), mulSat(units, p.T))}
}

// Charge takes units from a token bucket at now, beyond empty if need be.
func (s TokenBucket) Charge(p *Params, now, units int64) TokenBucket {
	s = s.refill(p, now)
	s.Tokens = SubSat(s.Tokens, mulSat(units, p.T))
	return s
}

// Charge takes units from a region's part at now, beyond empty if need be.
func (s Portion) Charge(p *Params, now, units int64) Portion {
	s = s.settle(p, now)
	s.Level = SubSat(s.Level, mulSat(mulSat(units, p.T), Whole))
	return s
}

// Charge pours units into a leaky meter at now, beyond full if need be.
func (s LeakyMeter) Charge(p *Params, now, units int64) LeakyMeter {
	s = s.drain(now)
	s.Level = AddSat(s.Level, mulSat(units, p.T))
	return s
}

// Charge queues units in a leaky queue at now, beyond its size if need be:
// they delay the departures of every later request.
func (s LeakyQueue) Charge(p *Params, now, units int64) LeakyQueue {
	return LeakyQueue{Next: AddSat(max(s.Next, now), mulSat(units, p.T))}
}

// Charge counts units in now's window, beyond its limit if need be.
func (s FixedWindow) Charge(p *Params, now, units int64) FixedWindow {
	if start, _ := p.window(now); start > s.Start {
		s = FixedWindow{Start: start}
	}
	s.Count = AddSat(s.Count, units)
	return s
}

// Charge counts units in the current window, beyond its limit if need be.
func (s SlidingWindow) Charge(p *Params, now, units int64) SlidingWindow {
	s, _ = s.roll(p, now)
	s.Cur = AddSat(s.Cur, units)
	return s
}

// Charge logs units entries at now, as many as fit in a log of L entries.
func (s *SlidingLog) Charge(p *Params, now, units int64) {
	now = s.expire(p, now)
	if room := p.Burst - int64(s.n); room > 0 {
		s.Commit(p, now, min(units, room))
	}
}

// Charge takes units from the key at now, beyond its limit if need be.
func (s *State) Charge(now, units int64) {
	p := &s.P
	switch p.Algorithm {
	case sluice.GCRA:
		s.gcra = s.gcra.Charge(p, now, units)
	case sluice.TokenBucket:
		if p.Portion > 0 {
			*s.portion(now) = s.portion(now).Charge(p, now, units)
			return
		}
		if !s.started {
			s.tb, s.started = p.NewTokenBucket(now), true
		}
		s.tb = s.tb.Charge(p, now, units)
	case sluice.LeakyMeter:
		s.meter = s.meter.Charge(p, now, units)
	case sluice.LeakyQueue:
		s.queue = s.queue.Charge(p, now, units)
	case sluice.FixedWindow:
		s.fixed = s.fixed.Charge(p, now, units)
	case sluice.SlidingLog:
		s.log.Charge(p, now, units)
	case sluice.SlidingWindow:
		s.sliding = s.sliding.Charge(p, now, units)
	}
}
