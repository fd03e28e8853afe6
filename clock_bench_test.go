package sluice

import (
	"testing"
	"time"
)

// The cost of one clock read, the part of an embedded-store decision that is
// not the limiter's: go test -run '^$' -bench ClockNow -count 6 .
func BenchmarkClockNow(b *testing.B) {
	var sink int64
	b.Run("system", func(b *testing.B) {
		c := NewSystemClock()
		for b.Loop() {
			sink += c.Now()
		}
	})
	// time.Now reads the wall clock as well as the monotonic one: two
	// reads where time.Since on a monotonic start makes one.
	b.Run("time.Now", func(b *testing.B) {
		for b.Loop() {
			sink += time.Now().UnixNano()
		}
	})
	b.Run("coarse-1ms", func(b *testing.B) {
		c := NewCoarseClock(time.Millisecond)
		defer c.Stop()
		for b.Loop() {
			sink += c.Now()
		}
	})
	_ = sink
}
