package algo

import "github.com/sluice-rl/sluice"

// Refunds give units back to a key: a request that was admitted but never
// served (its client gave up while queued, or a multi-key take in a cluster
// was denied by another key). A refund never makes a key fuller than full:
// giving back more than was taken leaves it idle.

// Refund gives units back to a GCRA key at now.
func (s GCRA) Refund(p *Params, now, units int64) GCRA {
	if s.TAT <= now {
		return s
	}
	return GCRA{TAT: max(SubSat(s.TAT, units*p.T), now)}
}

// Refund gives units back to a token bucket at now.
func (s TokenBucket) Refund(p *Params, now, units int64) TokenBucket {
	s = s.refill(p, now)
	s.Tokens = min(p.D, AddSat(s.Tokens, units*p.T))
	return s
}

// Refund takes units back out of a leaky meter at now.
func (s LeakyMeter) Refund(p *Params, now, units int64) LeakyMeter {
	s = s.drain(now)
	s.Level = max(0, s.Level-units*p.T)
	return s
}

// Refund gives a leaky queue back units of its last slots at now: the last
// departure moves earlier, never before now.
func (s LeakyQueue) Refund(p *Params, now, units int64) LeakyQueue {
	if s.Next <= now {
		return s
	}
	return LeakyQueue{Next: max(SubSat(s.Next, units*p.T), now)}
}

// Refund takes units back out of the current window's count.
func (s FixedWindow) Refund(p *Params, now, units int64) FixedWindow {
	if start, _ := p.window(now); start != s.Start {
		return s // the window the units were counted in has passed
	}
	s.Count = max(0, s.Count-units)
	return s
}

// Refund takes units back out of the current window's count.
func (s SlidingWindow) Refund(p *Params, now, units int64) SlidingWindow {
	s, _ = s.roll(p, now)
	s.Cur = max(0, s.Cur-units)
	return s
}

// Refund removes the newest units entries of the log.
func (s *SlidingLog) Refund(p *Params, now, units int64) {
	s.expire(p, now)
	s.Undo(units)
}

// Refund gives units back to the key at now.
func (s *State) Refund(now, units int64) {
	p := &s.P
	switch p.Algorithm {
	case sluice.GCRA:
		s.gcra = s.gcra.Refund(p, now, units)
	case sluice.TokenBucket:
		if p.Portion > 0 {
			var r Result
			*s.portion(now) = s.portion(now).Take(p, now, -units, &r)
			return
		}
		if s.started {
			s.tb = s.tb.Refund(p, now, units)
		}
	case sluice.LeakyMeter:
		s.meter = s.meter.Refund(p, now, units)
	case sluice.LeakyQueue:
		s.queue = s.queue.Refund(p, now, units)
	case sluice.FixedWindow:
		s.fixed = s.fixed.Refund(p, now, units)
	case sluice.SlidingLog:
		s.log.Refund(p, now, units)
	case sluice.SlidingWindow:
		s.sliding = s.sliding.Refund(p, now, units)
	}
}
