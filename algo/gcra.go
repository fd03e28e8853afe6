package algo

// GCRA is the state of the generic cell rate algorithm: the theoretical
// arrival time TAT, in nanoseconds. The zero value is a fresh, full key.
//
// With T the emission interval and D = b*T the tolerance, a take of cost c at
// now computes tat = max(TAT, now) and new_tat = tat + c*T; it is allowed iff
// new_tat - now <= D, and then TAT becomes new_tat. That is the usual
// weighted form "tat + c*T - now > tau + T rejects", with tau = (b-1)*T. On rejection
// RetryAfter = new_tat - D - now; ResetAfter = TAT - now after the take;
// Remaining = floor((D - (TAT - now)) / T). GCRA decides exactly as a token
// bucket of the same T and b.
type GCRA struct {
	TAT int64
}

// Take decides a take of cost units at now.
func (s GCRA) Take(p *Params, now, cost int64, r *Result) GCRA {
	tat := max(s.TAT, now)
	backlog := SubSat(tat, now) // time until the bucket is full again
	if cost == 0 {
		if backlog > p.D { // in debt: over the limit until the debt is paid off
			*r = limited(0, backlog-p.D, backlog)
		} else {
			*r = allowed(gcraRemaining(p, backlog), backlog)
		}
		return s
	}
	if cost > p.Burst {
		*r = tooLarge(gcraRemaining(p, backlog), backlog)
		return s
	}
	after := AddSat(backlog, cost*p.T)
	if after > p.D {
		*r = limited(gcraRemaining(p, backlog), after-p.D, backlog)
		return s
	}
	*r = allowed(gcraRemaining(p, after), after)
	return GCRA{TAT: AddSat(tat, cost*p.T)}
}

// Idle reports whether the key is back to its full state at now, so its slot
// can be forgotten without changing any answer.
func (s GCRA) Idle(now int64) bool { return s.TAT <= now }

func gcraRemaining(p *Params, backlog int64) int64 {
	if backlog >= p.D {
		return 0
	}
	return (p.D - backlog) / p.T
}
