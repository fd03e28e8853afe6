package algo

// TokenBucket is the state of a token bucket: the tokens it holds and the time
// it was last refilled. Tokens are counted in nanoseconds of refill time (one
// token is T), so refilling is an exact integer addition. A fresh key starts
// full: see [Params.NewTokenBucket].
//
// A take of cost c at now refills tokens = min(D, tokens + (now - last)) and is
// allowed iff tokens >= c*T, which then leaves tokens - c*T. On rejection
// RetryAfter = c*T - tokens, the time until enough tokens are back.
// ResetAfter = D - tokens; Remaining = floor(tokens / T).
type TokenBucket struct {
	Tokens int64 // tokens times T, at most D; below 0 in debt (see Charge)
	Last   int64 // time of the last refill
}

// NewTokenBucket returns a full bucket as of now.
func (p *Params) NewTokenBucket(now int64) TokenBucket {
	return TokenBucket{Tokens: p.D, Last: now}
}

// Take decides a take of cost units at now.
func (s TokenBucket) Take(p *Params, now, cost int64, r *Result) TokenBucket {
	s = s.refill(p, now)
	if cost == 0 {
		if s.Tokens < 0 { // in debt: over the limit until refilled to empty
			*r = limited(0, SubSat(0, s.Tokens), SubSat(p.D, s.Tokens))
		} else {
			*r = allowed(s.Tokens/p.T, SubSat(p.D, s.Tokens))
		}
		return s
	}
	if cost > p.Burst {
		*r = tooLarge(s.Tokens/p.T, SubSat(p.D, s.Tokens))
		return s
	}
	need := cost * p.T
	if s.Tokens < need {
		*r = limited(s.Tokens/p.T, SubSat(need, s.Tokens), SubSat(p.D, s.Tokens))
		return s
	}
	s.Tokens -= need
	*r = allowed(s.Tokens/p.T, p.D-s.Tokens)
	return s
}

// refill adds the tokens earned since Last; an earlier now adds none.
func (s TokenBucket) refill(p *Params, now int64) TokenBucket {
	if now <= s.Last {
		return s
	}
	elapsed := SubSat(now, s.Last)
	if elapsed >= SubSat(p.D, s.Tokens) {
		return TokenBucket{Tokens: p.D, Last: now}
	}
	return TokenBucket{Tokens: s.Tokens + elapsed, Last: now}
}

// Idle reports whether the bucket is full again at now.
func (s TokenBucket) Idle(p *Params, now int64) bool { return s.refill(p, now).Tokens == p.D }
