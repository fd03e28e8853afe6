package algo

// LeakyQueue is the state of a leaky bucket used as a queue (a shaper): Next,
// the earliest instant the next unit may leave. Units leave one every T; the
// queue holds b units. The zero value is a fresh, empty queue.
//
// The units queued at now are those whose departure is strictly later than
// now: with the last departure at Next - T, that is ceil((Next - T - now) / T)
// when positive. A request of cost c is admitted iff queued + c <= b; its
// units leave at max(now, Next), then every T, and the request leaves with its
// last unit, at departure = max(now, Next) + (c-1)*T; Next becomes
// departure + T and Delay = departure - now. (For c = 1 this is the textbook
// queue: rejected when b admitted requests depart after its arrival, else
// departure = max(arrival, previous departure + T).) On rejection RetryAfter
// = (Next - T) - (b - c)*T - now, the instant enough units have left.
// ResetAfter = Next - now; Remaining = b - queued.
type LeakyQueue struct {
	Next int64
}

// Take decides a take of cost units at now.
func (s LeakyQueue) Take(p *Params, now, cost int64, r *Result) LeakyQueue {
	queued := s.queued(p, now)
	reset := max(0, SubSat(s.Next, now))
	if cost == 0 {
		// queued is capped at Burst; a queue in debt holds more, ahead
		// being more than Burst departures' worth of time.
		if over := SubSat(SubSat(SubSat(s.Next, p.T), now), mulSat(p.Burst, p.T)); over > 0 {
			*r = limited(0, over, reset)
		} else {
			*r = allowed(p.Burst-queued, reset)
		}
		return s
	}
	if cost > p.Burst {
		*r = tooLarge(p.Burst-queued, reset)
		return s
	}
	if queued+cost > p.Burst {
		retry := SubSat(SubSat(s.Next-p.T, now), (p.Burst-cost)*p.T)
		*r = limited(p.Burst-queued, retry, reset)
		return s
	}
	departure := AddSat(max(now, s.Next), (cost-1)*p.T)
	next := LeakyQueue{Next: AddSat(departure, p.T)}
	*r = allowed(p.Burst-next.queued(p, now), SubSat(next.Next, now))
	r.Delay = departure - now
	return next
}

// queued returns the number of admitted units that leave after now.
func (s LeakyQueue) queued(p *Params, now int64) int64 {
	ahead := SubSat(SubSat(s.Next, p.T), now)
	if ahead <= 0 {
		return 0
	}
	return min(ceilDiv(ahead, p.T), p.Burst)
}

// Idle reports whether the queue is empty and unthrottled at now.
func (s LeakyQueue) Idle(now int64) bool { return s.Next <= now }
