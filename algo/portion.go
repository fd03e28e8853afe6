package algo

import "math"

// A Portion is one region's part of a token bucket that several regions
// share, each deciding on its own store: a global limit (rate r, burst b)
// of which the region holds a share s, in thousandths (Whole is all of
// it). The region's part is a token bucket of capacity s·b refilled at
// s·r, so that while the shares add up to at most Whole, so do the parts'
// capacities and rates.
//
// The invariant that keeps the regions together within the global bound
// (at most b + r·t pass over any interval of length t): a change of share
// never makes tokens. A share that grows brings capacity, not tokens (the
// new capacity fills at the new rate); a share that shrinks drops the
// tokens above the new capacity. Tokens held across all regions are then
// at most b, they are refilled at most at r in all, and a change of share
// only removes tokens. Refilling at the share in force needs the share's
// history between two takes: every change goes through Set, which settles
// the part at the old share first, and a lease's end (Until) is the one
// change that happens by itself, which Take settles at the instant it
// falls.
//
// Tokens are counted in nanoseconds of the global refill time times
// thousandths of share (one token is T·Whole), so that refilling a share s
// for a time e adds exactly e·s. A region that has never heard of the key
// holds its own share (Own), full: the regions' own shares add up to at
// most Whole, so every fresh key's parts together hold at most b.
type Portion struct {
	Level int64 // tokens, in ns·thousandths; below 0 in debt
	Last  int64 // the time Level was settled at
	Held  int64 // the share held, in thousandths
	Until int64 // when a share above Own ends (0: it does not)
	Own   int64 // the share the region falls back to
}

// Whole is all of a limit, in the thousandths shares are counted in.
const Whole = 1000

// PortionFits reports whether p's capacity can be counted in thousandths
// of share without overflowing 64 bits.
func PortionFits(p *Params) bool { return p.D <= math.MaxInt64/Whole }

// NewPortion returns the part of a fresh key for a region whose own share
// is own, full, as of now.
func NewPortion(p *Params, own, now int64) Portion {
	own = clampShare(own)
	return Portion{Level: p.D * own, Last: now, Held: own, Own: own}
}

// Share is the share in force at t.
func (s Portion) Share(t int64) int64 {
	if s.Held > s.Own && s.Until != 0 && t >= s.Until {
		return s.Own
	}
	return s.Held
}

// settle refills s up to now at the shares in force, capping each stretch
// at its capacity: a lease that ends between Last and now refills at the
// held share until its end and at Own after. An earlier now settles
// nothing (time going back adds nothing).
func (s Portion) settle(p *Params, now int64) Portion {
	if now <= s.Last {
		return s
	}
	if until := s.Until; s.Held > s.Own && until != 0 && until < now {
		if until > s.Last {
			s = s.refill(p, until-s.Last, s.Held)
			s.Last = until
		}
		s.Held, s.Until = s.Own, 0
		s.Level = min(s.Level, p.D*s.Own)
	}
	s = s.refill(p, now-s.Last, s.Held)
	s.Last = now
	return s
}

// refill adds elapsed·share tokens, at most to the share's capacity.
func (s Portion) refill(p *Params, elapsed, share int64) Portion {
	capacity := p.D * share
	if s.Level >= capacity {
		return s // full, or over after a share that shrank (Set caps it)
	}
	if share > 0 && elapsed >= ceilDiv(SubSat(capacity, s.Level), share) {
		s.Level = capacity
		return s
	}
	s.Level += elapsed * share
	return s
}

// Set changes the share held to held, above Own until until (0: no end),
// as of now: the part is settled at the share in force first, then the
// tokens above the new capacity are dropped.
func (s Portion) Set(p *Params, now, held, until int64) Portion {
	s = s.settle(p, now)
	s.Held = clampShare(held)
	s.Until = until
	if s.Held <= s.Own {
		s.Until = 0
	}
	s.Level = min(s.Level, p.D*s.Held)
	return s
}

// SetOwn changes the share the region falls back to (the rule's regions
// changed), as of now.
func (s Portion) SetOwn(p *Params, now, own int64) Portion {
	s = s.settle(p, now)
	s.Own = clampShare(own)
	if s.Held <= s.Own {
		s.Until = 0
	}
	s.Level = min(s.Level, p.D*s.Share(now))
	return s
}

// Take decides a take of cost units of the global limit at now. A cost
// above the global burst can never pass (too large); one above the part's
// capacity is refused until the share grows. A negative cost gives units
// back (never beyond the capacity); 0 peeks.
func (s Portion) Take(p *Params, now, cost int64, r *Result) Portion {
	s = s.settle(p, now)
	share := s.Held
	unit := p.T * Whole
	reset := func() int64 { // the time to a full part at this share
		if share <= 0 {
			return 0
		}
		return ceilDiv(SubSat(p.D*share, s.Level), share)
	}
	switch {
	case cost < 0:
		s.Level = min(AddSat(s.Level, mulSat(SubSat(0, cost), unit)), p.D*share)
		*r = allowed(s.Level/unit, reset())
		r.Applied()
		return s
	case cost == 0:
		if s.Level < 0 {
			*r = limited(0, s.wait(p, 0), reset())
		} else {
			*r = allowed(s.Level/unit, reset())
		}
		return s
	case cost > p.Burst:
		*r = tooLarge(s.Level/unit, reset())
		return s
	}
	need := cost * unit
	if s.Level < need {
		*r = limited(s.Level/unit, s.wait(p, need), reset())
		return s
	}
	s.Level -= need
	*r = allowed(s.Level/unit, reset())
	return s
}

// wait is the time until the part holds need tokens at the share held:
// never, while the share cannot hold them, which the caller hears as the
// global period (a share changes within it, or the region asks again).
func (s Portion) wait(p *Params, need int64) int64 {
	if s.Held <= 0 || need > p.D*s.Held {
		return p.W
	}
	return ceilDiv(need-s.Level, s.Held)
}

func clampShare(s int64) int64 { return min(max(s, 0), Whole) }
