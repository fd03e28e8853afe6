package memory

import "github.com/sluice-rl/sluice/algo"

// A cell is one key's state in a table slot (GCRA has a table of its own,
// in gcratable.go). Each algorithm gets its own cell
// type so a slot is exactly as large as its algorithm needs: 8 bytes of state
// for the leaky queue, 16 for the token bucket, leaky meter and fixed
// window, 24 for the sliding window counter, and a pointer for the sliding log.
type cellOps[C any] interface {
	*C
	// take decides a take at now and, if it is allowed, commits it.
	take(p *algo.Params, now, cost int64) algo.Result
	// save returns the state to hand to restore.
	save() saved
	// restore undoes a committed take of cost, given the state saved before it.
	restore(s saved, cost int64)
	// fresh makes the cell a new, full key at now.
	fresh(p *algo.Params, now int64)
	// resetAfter returns the time until the key is idle; 0 means the slot
	// is dead and can be reused without changing any answer.
	resetAfter(p *algo.Params, now int64) int64
}

// saved holds any fixed-size state: the largest is three int64 words.
type saved [3]int64

type tokenBucketCell struct{ s algo.TokenBucket }

func (c *tokenBucketCell) take(p *algo.Params, now, cost int64) (r algo.Result) {
	c.s = c.s.Take(p, now, cost, &r)
	return r
}
func (c *tokenBucketCell) save() saved                     { return saved{c.s.Tokens, c.s.Last} }
func (c *tokenBucketCell) restore(s saved, _ int64)        { c.s = algo.TokenBucket{Tokens: s[0], Last: s[1]} }
func (c *tokenBucketCell) fresh(p *algo.Params, now int64) { c.s = p.NewTokenBucket(now) }
func (c *tokenBucketCell) resetAfter(p *algo.Params, now int64) int64 {
	var r algo.Result
	c.s.Take(p, now, 0, &r)
	return r.ResetAfter
}

type leakyMeterCell struct{ s algo.LeakyMeter }

func (c *leakyMeterCell) take(p *algo.Params, now, cost int64) (r algo.Result) {
	c.s = c.s.Take(p, now, cost, &r)
	return r
}
func (c *leakyMeterCell) save() saved               { return saved{c.s.Level, c.s.Last} }
func (c *leakyMeterCell) restore(s saved, _ int64)  { c.s = algo.LeakyMeter{Level: s[0], Last: s[1]} }
func (c *leakyMeterCell) fresh(*algo.Params, int64) { c.s = algo.LeakyMeter{} }
func (c *leakyMeterCell) resetAfter(p *algo.Params, now int64) int64 {
	var r algo.Result
	c.s.Take(p, now, 0, &r)
	return r.ResetAfter
}

type leakyQueueCell struct{ s algo.LeakyQueue }

func (c *leakyQueueCell) take(p *algo.Params, now, cost int64) (r algo.Result) {
	c.s = c.s.Take(p, now, cost, &r)
	return r
}
func (c *leakyQueueCell) save() saved               { return saved{c.s.Next} }
func (c *leakyQueueCell) restore(s saved, _ int64)  { c.s.Next = s[0] }
func (c *leakyQueueCell) fresh(*algo.Params, int64) { c.s = algo.LeakyQueue{} }
func (c *leakyQueueCell) resetAfter(_ *algo.Params, now int64) int64 {
	return max(0, c.s.Next-now)
}

type fixedWindowCell struct{ s algo.FixedWindow }

func (c *fixedWindowCell) take(p *algo.Params, now, cost int64) (r algo.Result) {
	c.s = c.s.Take(p, now, cost, &r)
	return r
}
func (c *fixedWindowCell) save() saved               { return saved{c.s.Start, c.s.Count} }
func (c *fixedWindowCell) restore(s saved, _ int64)  { c.s = algo.FixedWindow{Start: s[0], Count: s[1]} }
func (c *fixedWindowCell) fresh(*algo.Params, int64) { c.s = algo.FixedWindow{} }
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
func (c *slidingWindowCell) save() saved { return saved{c.s.Start, c.s.Prev, c.s.Cur} }
func (c *slidingWindowCell) restore(s saved, _ int64) {
	c.s = algo.SlidingWindow{Start: s[0], Prev: s[1], Cur: s[2]}
}
func (c *slidingWindowCell) fresh(*algo.Params, int64) { c.s = algo.SlidingWindow{} }
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
func (c *slidingLogCell) save() saved                 { return saved{} }
func (c *slidingLogCell) restore(_ saved, cost int64) { c.log.Undo(cost) }
func (c *slidingLogCell) fresh(*algo.Params, int64) {
	if c.log == nil {
		c.log = new(algo.SlidingLog)
	}
	c.log.Reset()
}
func (c *slidingLogCell) resetAfter(p *algo.Params, now int64) int64 {
	if c.log == nil || c.log.Idle(p, now) {
		return 0
	}
	var r algo.Result
	c.log.Decide(p, now, 0, &r)
	return r.ResetAfter
}
