package algo

// SlidingLog is the state of a sliding window log: the time of every unit
// admitted within the last window, oldest first, in a ring buffer that grows
// as needed up to L entries. The zero value is a fresh key.
//
// An entry made at time t is in the window at now iff now - W < t: an entry
// exactly one window old has left. A take of cost c is allowed iff
// count + c <= L, and then logs c entries at now. On rejection, with
// k = count + c - L, RetryAfter is the time until the k-th oldest entry
// leaves: t_k + W - now. ResetAfter is the time until the newest entry
// leaves; Remaining = L - count. A now earlier than the newest entry counts
// as that entry's time, so the log stays ordered.
//
// Unlike the fixed-size states, a SlidingLog is updated in place in two steps
// so that a store can decide several takes before it commits any: Decide,
// then Commit with the same now and cost if the take goes ahead.
type SlidingLog struct {
	buf  []int64 // ring buffer; len(buf) is its capacity
	head int     // index of the oldest entry
	n    int     // number of entries
}

// Decide decides a take of cost units at now, without logging it. It drops
// the entries that have left the window, which changes no answer.
func (s *SlidingLog) Decide(p *Params, now, cost int64, r *Result) {
	now = s.expire(p, now)
	count := int64(s.n)
	reset := int64(0)
	if s.n > 0 {
		reset = AddSat(s.at(s.n-1), p.W) - now
	}
	if cost == 0 {
		if over := count - p.Burst; over > 0 {
			// Carried from a larger limit (see Carry): over it until the
			// over-th oldest entry has left.
			*r = limited(0, AddSat(s.at(int(over-1)), p.W)-now, reset)
		} else {
			*r = allowed(p.Burst-count, reset)
		}
		return
	}
	if cost > p.Burst {
		*r = tooLarge(max(p.Burst-count, 0), reset)
		return
	}
	if k := count + cost - p.Burst; k > 0 {
		*r = limited(max(p.Burst-count, 0), AddSat(s.at(int(k-1)), p.W)-now, reset)
		return
	}
	*r = allowed(p.Burst-count-cost, p.W)
}

// Commit logs cost entries at now. Call it only after Decide allowed the same
// take at the same now.
func (s *SlidingLog) Commit(p *Params, now, cost int64) {
	if s.n > 0 {
		now = max(now, s.at(s.n-1))
	}
	s.grow(p, s.n+int(cost))
	for range cost {
		s.buf[(s.head+s.n)%len(s.buf)] = now
		s.n++
	}
}

// Undo removes the cost newest entries: it reverses the last Commit of that
// cost, for a store whose multi-key take was denied by another key.
func (s *SlidingLog) Undo(cost int64) {
	s.n = max(0, s.n-int(cost))
}

// Take decides a take and, if it is allowed, logs it.
func (s *SlidingLog) Take(p *Params, now, cost int64, r *Result) {
	s.Decide(p, now, cost, r)
	if r.Allowed && cost > 0 {
		s.Commit(p, now, cost)
	}
}

// Len returns the number of logged entries, some of which may have left the
// window since the last take.
func (s *SlidingLog) Len() int { return s.n }

// Idle reports whether every entry has left the window at now.
func (s *SlidingLog) Idle(p *Params, now int64) bool {
	return s.n == 0 || s.at(s.n-1) <= now-p.W
}

// Reset empties the log and keeps its buffer for reuse.
func (s *SlidingLog) Reset() { s.head, s.n = 0, 0 }

// at returns the i-th oldest entry.
func (s *SlidingLog) at(i int) int64 { return s.buf[(s.head+i)%len(s.buf)] }

// expire drops entries at or before now - W and returns the effective now.
func (s *SlidingLog) expire(p *Params, now int64) int64 {
	if s.n == 0 {
		return now
	}
	now = max(now, s.at(s.n-1))
	cutoff := SubSat(now, p.W)
	for s.n > 0 && s.buf[s.head] <= cutoff {
		s.head = (s.head + 1) % len(s.buf)
		s.n--
	}
	if s.n == 0 {
		s.head = 0
	}
	return now
}

// grow makes room for n entries, doubling the buffer up to Burst entries.
func (s *SlidingLog) grow(p *Params, n int) {
	if n <= len(s.buf) {
		return
	}
	size := max(n, min(2*len(s.buf), int(p.Burst)), 4)
	size = min(size, int(p.Burst))
	buf := make([]int64, size)
	for i := range s.n {
		buf[i] = s.at(i)
	}
	s.buf, s.head = buf, 0
}

// Clone returns a copy of the log that shares nothing with it.
func (s *SlidingLog) Clone() *SlidingLog {
	c := &SlidingLog{buf: make([]int64, max(s.n, 1))}
	for i := range s.n {
		c.buf[i] = s.at(i)
	}
	c.n = s.n
	return c
}
