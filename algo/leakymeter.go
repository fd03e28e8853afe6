package algo

// LeakyMeter is the state of a leaky bucket used as a meter (a policer): the
// water level and the time it last drained. The level is counted in
// nanoseconds of drain time (one unit is T). The zero value is a fresh, empty
// bucket.
//
// The bucket drains at the rate: level = max(0, level - (now - last)). A take
// of cost c is allowed iff level + c*T <= D, and then pours c units in. It
// decides exactly as a token bucket whose tokens are D - level. On rejection
// RetryAfter = level + c*T - D; ResetAfter = level; Remaining =
// floor((D - level) / T).
type LeakyMeter struct {
	Level int64 // units times T, at least 0; above D in debt (see Charge)
	Last  int64 // time of the last drain
}

// Take decides a take of cost units at now.
func (s LeakyMeter) Take(p *Params, now, cost int64, r *Result) LeakyMeter {
	s = s.drain(now)
	room := p.D - s.Level
	if cost == 0 {
		if room < 0 { // in debt: over the limit until drained to full
			*r = limited(0, SubSat(s.Level, p.D), s.Level)
		} else {
			*r = allowed(room/p.T, s.Level)
		}
		return s
	}
	if cost > p.Burst {
		*r = tooLarge(room/p.T, s.Level)
		return s
	}
	need := cost * p.T
	if need > room {
		*r = limited(room/p.T, SubSat(need, room), s.Level)
		return s
	}
	s.Level += need
	*r = allowed((room-need)/p.T, s.Level)
	return s
}

// drain lets out what leaked since Last; an earlier now drains nothing.
func (s LeakyMeter) drain(now int64) LeakyMeter {
	if now <= s.Last {
		return s
	}
	elapsed := SubSat(now, s.Last)
	if elapsed >= s.Level {
		return LeakyMeter{Level: 0, Last: now}
	}
	return LeakyMeter{Level: s.Level - elapsed, Last: now}
}

// Idle reports whether the bucket is empty at now.
func (s LeakyMeter) Idle(now int64) bool { return s.drain(now).Level == 0 }
