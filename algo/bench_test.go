package algo

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
)

// Each benchmark takes one unit per iteration from one key, the clock moving
// by about half the emission interval per take so that allowed and limited
// decisions alternate as they do under load.
func benchLimit(b *testing.B, a sluice.Algorithm) (Params, int64) {
	l := sluice.Limit{Rate: 100, Period: time.Second, Algorithm: a}
	if a.IsBucket() {
		l.Burst = 20
	}
	return mustParams(b, l), int64(5 * time.Millisecond)
}

func BenchmarkGCRA(b *testing.B) {
	p, step := benchLimit(b, sluice.GCRA)
	var s GCRA
	now := int64(1_700_000_000_000_000_000)
	var r Result
	for b.Loop() {
		now += step
		s = s.Take(&p, now, 1, &r)
	}
	sinkResult = r
}

func BenchmarkTokenBucket(b *testing.B) {
	p, step := benchLimit(b, sluice.TokenBucket)
	now := int64(1_700_000_000_000_000_000)
	var r Result
	s := p.NewTokenBucket(now)
	for b.Loop() {
		now += step
		s = s.Take(&p, now, 1, &r)
	}
	sinkResult = r
}

func BenchmarkLeakyMeter(b *testing.B) {
	p, step := benchLimit(b, sluice.LeakyMeter)
	var s LeakyMeter
	now := int64(1_700_000_000_000_000_000)
	var r Result
	for b.Loop() {
		now += step
		s = s.Take(&p, now, 1, &r)
	}
	sinkResult = r
}

func BenchmarkLeakyQueue(b *testing.B) {
	p, step := benchLimit(b, sluice.LeakyQueue)
	var s LeakyQueue
	now := int64(1_700_000_000_000_000_000)
	var r Result
	for b.Loop() {
		now += step
		s = s.Take(&p, now, 1, &r)
	}
	sinkResult = r
}

func BenchmarkFixedWindow(b *testing.B) {
	p, step := benchLimit(b, sluice.FixedWindow)
	var s FixedWindow
	now := int64(1_700_000_000_000_000_000)
	var r Result
	for b.Loop() {
		now += step
		s = s.Take(&p, now, 1, &r)
	}
	sinkResult = r
}

func BenchmarkSlidingWindow(b *testing.B) {
	p, step := benchLimit(b, sluice.SlidingWindow)
	var s SlidingWindow
	now := int64(1_700_000_000_000_000_000)
	var r Result
	for b.Loop() {
		now += step
		s = s.Take(&p, now, 1, &r)
	}
	sinkResult = r
}

func BenchmarkSlidingLog(b *testing.B) {
	p, step := benchLimit(b, sluice.SlidingLog)
	var s SlidingLog
	now := int64(1_700_000_000_000_000_000)
	var r Result
	for b.Loop() {
		now += step
		s.Take(&p, now, 1, &r)
	}
	sinkResult = r
}

// sinkResult keeps the benchmarks' results alive.
var sinkResult Result
