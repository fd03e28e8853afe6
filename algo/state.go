package algo

import "github.com/sluice-rl/sluice"

// State is one key's state under any of the algorithms, chosen by its
// Params: the simplest way to run an algorithm named at run time, for
// simulators and tests. Stores keep the typed states instead, which are
// smaller. The zero value is a fresh key.
type State struct {
	P Params

	gcra    GCRA
	tb      TokenBucket
	started bool // the token bucket starts full at its first take
	meter   LeakyMeter
	queue   LeakyQueue
	fixed   FixedWindow
	log     SlidingLog
	sliding SlidingWindow
	part    Portion // a token bucket with Params.Portion: a region's part
}

// portion is the part of a token bucket with Params.Portion, fresh at now
// until its first take.
func (s *State) portion(now int64) *Portion {
	if !s.started {
		s.part, s.started = NewPortion(&s.P, s.P.Portion, now), true
	}
	return &s.part
}

// NewState returns a fresh key under the limit p.
func NewState(p Params) *State { return &State{P: p} }

// Take decides a take of cost at now, commits it if allowed, and writes the
// result to r.
func (s *State) Take(now, cost int64, r *Result) {
	p := &s.P
	switch p.Algorithm {
	case sluice.GCRA:
		s.gcra = s.gcra.Take(p, now, cost, r)
	case sluice.TokenBucket:
		if p.Portion > 0 {
			*s.portion(now) = s.portion(now).Take(p, now, cost, r)
			return
		}
		if !s.started {
			s.tb, s.started = p.NewTokenBucket(now), true
		}
		s.tb = s.tb.Take(p, now, cost, r)
	case sluice.LeakyMeter:
		s.meter = s.meter.Take(p, now, cost, r)
	case sluice.LeakyQueue:
		s.queue = s.queue.Take(p, now, cost, r)
	case sluice.FixedWindow:
		s.fixed = s.fixed.Take(p, now, cost, r)
	case sluice.SlidingLog:
		s.log.Take(p, now, cost, r)
	case sluice.SlidingWindow:
		s.sliding = s.sliding.Take(p, now, cost, r)
	}
}

// Carry moves the key to the limit to at now, converting its state so that
// what it spent stays spent (see GCRA.Carry and its siblings). A limit of
// another algorithm, or a region's part of a global limit, starts afresh.
func (s *State) Carry(to Params, now int64) {
	from := s.P
	if from.Algorithm != to.Algorithm || from.Portion > 0 || to.Portion > 0 {
		*s = State{P: to}
		return
	}
	switch to.Algorithm {
	case sluice.GCRA:
		s.gcra = s.gcra.Carry(&from, &to, now)
	case sluice.TokenBucket:
		if s.started {
			s.tb = s.tb.Carry(&from, &to, now)
		}
	case sluice.LeakyMeter:
		s.meter = s.meter.Carry(&from, &to, now)
	case sluice.LeakyQueue:
		s.queue = s.queue.Carry(&from, &to, now)
	case sluice.FixedWindow:
		s.fixed = s.fixed.Carry(&from, &to, now)
	case sluice.SlidingLog:
		s.log.Carry(&from, &to, now)
	case sluice.SlidingWindow:
		s.sliding = s.sliding.Carry(&from, &to, now)
	}
	s.P = to
}
