package memory

import "github.com/sluice-rl/sluice/algo"

// A cell is one key's state in a slot of a locked table: the algorithms
// whose state does not fit one word (the one-word algorithms have a lock-free
// table of their own, in wordtable.go). Each algorithm gets its own cell
// type so a slot is exactly as large as its algorithm needs: 16 bytes of
// state for the fixed window, 24 for the sliding window counter, and a
// pointer for the sliding log, and 40 for a region's part of a global limit.
type cellOps[C any] interface {
	*C
	// take decides a take at now and, if it is allowed, commits it.
	take(p *algo.Params, now, cost int64) algo.Result
	// save returns the state to hand to restore.
	save() saved
	// restore undoes a committed take of cost, given the state saved before it.
	restore(s saved, cost int64)
	// refund gives units back at now.
	refund(p *algo.Params, now, units int64)
	// charge takes units at now whatever the limit says (algo's Charge).
	charge(p *algo.Params, now, units int64)
	// fresh makes the cell a new, full key at now.
	fresh(p *algo.Params, now int64)
	// resetAfter returns the time until the key is idle; 0 means the slot
	// is dead and can be reused without changing any answer.
	resetAfter(p *algo.Params, now int64) int64
	// limited reports whether the key would refuse a take of one unit at
	// now: such a key is never evicted.
	limited(p *algo.Params, now int64) bool
	// carry converts the state kept under from to the limit to (algo's
	// Carry).
	carry(from, to *algo.Params, now int64)
}

// saved holds any fixed-size state: the largest, a region's part, is four
// int64 words.
type saved [4]int64

type fixedWindowCell struct{ s algo.FixedWindow }

func (c *fixedWindowCell) take(p *algo.Params, now, cost int64) (r algo.Result) {
	c.s = c.s.Take(p, now, cost, &r)
	return r
}
func (c *fixedWindowCell) refund(p *algo.Params, now, units int64) {
	c.s = c.s.Refund(p, now, units)
}
func (c *fixedWindowCell) charge(p *algo.Params, now, units int64) {
	c.s = c.s.Charge(p, now, units)
}
func (c *fixedWindowCell) carry(from, to *algo.Params, now int64) {
	c.s = c.s.Carry(from, to, now)
}
func (c *fixedWindowCell) save() saved               { return saved{c.s.Start, c.s.Count} }
func (c *fixedWindowCell) restore(s saved, _ int64)  { c.s = algo.FixedWindow{Start: s[0], Count: s[1]} }
func (c *fixedWindowCell) fresh(*algo.Params, int64) { c.s = algo.FixedWindow{} }
func (c *fixedWindowCell) limited(p *algo.Params, now int64) bool {
	var r algo.Result
	c.s.Take(p, now, 0, &r)
	return r.Remaining == 0
}
func (c *fixedWindowCell) resetAfter(p *algo.Params, now int64) int64 {
	var r algo.Result
	c.s.Take(p, now, 0, &r)
	return r.ResetAfter
}

type slidingWindowCell struct{ s algo.SlidingWindow }

func (c *slidingWindowCell) take(p *algo.Params, now, cost int64) (r algo.Result) {
	c.s = c.s.Take(p, now, cost, &r)
	return r
}
func (c *slidingWindowCell) refund(p *algo.Params, now, units int64) {
	c.s = c.s.Refund(p, now, units)
}
func (c *slidingWindowCell) charge(p *algo.Params, now, units int64) {
	c.s = c.s.Charge(p, now, units)
}
func (c *slidingWindowCell) carry(from, to *algo.Params, now int64) {
	c.s = c.s.Carry(from, to, now)
}
func (c *slidingWindowCell) save() saved { return saved{c.s.Start, c.s.Prev, c.s.Cur} }
func (c *slidingWindowCell) restore(s saved, _ int64) {
	c.s = algo.SlidingWindow{Start: s[0], Prev: s[1], Cur: s[2]}
}
func (c *slidingWindowCell) fresh(*algo.Params, int64) { c.s = algo.SlidingWindow{} }
func (c *slidingWindowCell) limited(p *algo.Params, now int64) bool {
	var r algo.Result
	c.s.Take(p, now, 0, &r)
	return r.Remaining == 0
}
func (c *slidingWindowCell) resetAfter(p *algo.Params, now int64) int64 {
	var r algo.Result
	c.s.Take(p, now, 0, &r)
	return r.ResetAfter
}

// slidingLogCell points at the log, whose size varies with the traffic. A
// reused slot keeps its log's buffer.
type slidingLogCell struct{ log *algo.SlidingLog }

func (c *slidingLogCell) take(p *algo.Params, now, cost int64) (r algo.Result) {
	c.log.Take(p, now, cost, &r)
	return r
}
func (c *slidingLogCell) refund(p *algo.Params, now, units int64) {
	c.log.Refund(p, now, units)
}
func (c *slidingLogCell) charge(p *algo.Params, now, units int64) {
	c.log.Charge(p, now, units)
}
func (c *slidingLogCell) carry(from, to *algo.Params, now int64) {
	if c.log != nil {
		c.log = c.log.Clone() // the table it came from keeps its own a while
		c.log.Carry(from, to, now)
	}
}
func (c *slidingLogCell) save() saved                 { return saved{} }
func (c *slidingLogCell) restore(_ saved, cost int64) { c.log.Undo(cost) }
func (c *slidingLogCell) fresh(*algo.Params, int64) {
	if c.log == nil {
		c.log = new(algo.SlidingLog)
	}
	c.log.Reset()
}
func (c *slidingLogCell) limited(p *algo.Params, now int64) bool {
	if c.log == nil {
		return false
	}
	var r algo.Result
	c.log.Decide(p, now, 0, &r)
	return r.Remaining == 0
}
func (c *slidingLogCell) resetAfter(p *algo.Params, now int64) int64 {
	if c.log == nil || c.log.Idle(p, now) {
		return 0
	}
	var r algo.Result
	c.log.Decide(p, now, 0, &r)
	return r.ResetAfter
}

// portionCell is a region's part of a global limit (algo.Portion). A part
// holding less than its own share, or more under a lease, is never dropped:
// a fresh part holds the own share, full, and the region's agent has told
// the other regions it holds less, or counts on its lease.
type portionCell struct{ s algo.Portion }

func (c *portionCell) take(p *algo.Params, now, cost int64) (r algo.Result) {
	c.s = c.s.Take(p, now, cost, &r)
	return r
}
func (c *portionCell) refund(p *algo.Params, now, units int64) {
	var r algo.Result
	c.s = c.s.Take(p, now, -units, &r)
}
func (c *portionCell) charge(p *algo.Params, now, units int64) {
	c.s = c.s.Charge(p, now, units)
}
func (c *portionCell) carry(_, to *algo.Params, now int64) { c.fresh(to, now) } // a region's part is its agent's to set
func (c *portionCell) save() saved                         { return saved{c.s.Level, c.s.Last, c.s.Held, c.s.Until} }
func (c *portionCell) restore(s saved, _ int64) {
	c.s.Level, c.s.Last, c.s.Held, c.s.Until = s[0], s[1], s[2], s[3]
}
func (c *portionCell) fresh(p *algo.Params, now int64) { c.s = algo.NewPortion(p, p.Portion, now) }
func (c *portionCell) limited(p *algo.Params, now int64) bool {
	if c.s.Share(now) != c.s.Own {
		return true
	}
	var r algo.Result
	c.s.Take(p, now, 0, &r)
	return r.Remaining == 0
}
func (c *portionCell) resetAfter(p *algo.Params, now int64) int64 {
	if c.s.Share(now) < c.s.Own {
		return p.W + p.D // not idle until its share comes back
	}
	var r algo.Result
	c.s.Take(p, now, 0, &r)
	if c.s.Share(now) > c.s.Own {
		return max(r.ResetAfter, c.s.Until-now, 1)
	}
	return r.ResetAfter
}
