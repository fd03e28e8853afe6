package sluice

import (
	"sync/atomic"
	"time"
)

// Clock tells the time as nanoseconds since the Unix epoch. Algorithms take
// time as a parameter; stores read it from a Clock, so tests can move time by
// hand instead of sleeping.
type Clock interface {
	Now() int64
}

// SystemClock reads the wall clock once, then advances it by the monotonic
// clock, so that steps of the system time (NTP, an operator) never move it
// backwards while a process runs.
type SystemClock struct {
	start time.Time
}

// NewSystemClock returns a SystemClock anchored at the current wall time.
func NewSystemClock() *SystemClock { return &SystemClock{start: time.Now()} }

// Now implements Clock.
func (c *SystemClock) Now() int64 {
	return c.start.UnixNano() + int64(time.Since(c.start))
}

// ManualClock is a Clock that moves only when told to. It is safe for
// concurrent use.
type ManualClock struct {
	now atomic.Int64
}

// NewManualClock returns a ManualClock that reads now.
func NewManualClock(now time.Time) *ManualClock {
	c := &ManualClock{}
	c.now.Store(now.UnixNano())
	return c
}

// Now implements Clock.
func (c *ManualClock) Now() int64 { return c.now.Load() }

// Advance moves the clock by d (which may be negative, to test a clock that
// steps back).
func (c *ManualClock) Advance(d time.Duration) { c.now.Add(int64(d)) }

// Set sets the clock to t.
func (c *ManualClock) Set(t time.Time) { c.now.Store(t.UnixNano()) }
