package algo

import "github.com/sluice-rl/sluice"

// A take above a floor is admitted only if floor units would still be left
// after it: it decides as a take of cost + floor would, and consumes cost.
// Priority tiers share one limit this way: a lower tier's floor is the share
// the tiers above it keep, so it can never take that share, while they can.
// Its Remaining is what is left above the floor; RetryAfter is the time
// until cost + floor units are there.

// Decide decides a take of cost at now without consuming anything.
func (s *State) Decide(now, cost int64, r *Result) {
	p := &s.P
	switch p.Algorithm {
	case sluice.GCRA:
		s.gcra.Take(p, now, cost, r)
	case sluice.TokenBucket:
		if p.Portion > 0 {
			part := s.part
			if !s.started {
				part = NewPortion(p, p.Portion, now)
			}
			part.Take(p, now, cost, r)
			return
		}
		tb := s.tb
		if !s.started {
			tb = p.NewTokenBucket(now)
		}
		tb.Take(p, now, cost, r)
	case sluice.LeakyMeter:
		s.meter.Take(p, now, cost, r)
	case sluice.LeakyQueue:
		s.queue.Take(p, now, cost, r)
	case sluice.FixedWindow:
		s.fixed.Take(p, now, cost, r)
	case sluice.SlidingLog:
		s.log.Decide(p, now, cost, r)
	case sluice.SlidingWindow:
		s.sliding.Take(p, now, cost, r)
	}
}

// TakeAbove decides a take of cost at now that must leave floor units,
// commits it if allowed, and writes the result to r.
func (s *State) TakeAbove(now, cost, floor int64, r *Result) {
	if floor <= 0 || cost <= 0 {
		s.Take(now, cost, r)
		return
	}
	s.Decide(now, AddSat(cost, floor), r)
	if r.Allowed {
		s.Take(now, cost, r)
	}
	r.Remaining = max(r.Remaining-floor, 0)
}
