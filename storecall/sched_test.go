package storecall

import (
	"math"
	"runtime"
	"sync"
	"testing"
	"time"
)

// The extension follows the process's own scheduling latency: small when
// goroutines run at once, larger while more goroutines want to run than
// there are processors, and never beyond its bound.
func TestSchedulingLatencyExtendsTheDeadline(t *testing.T) {
	var w schedWatch
	w.read() // the baseline
	time.Sleep(20 * time.Millisecond)
	w.read()
	idle := time.Duration(w.delay.Load())
	// Keep 8 goroutines per processor busy for a while, so that each waits
	// for the others to run, and sample the latency they see. The runtime
	// samples scheduling latency, and a machine busy with other processes
	// may starve this one of the very preemptions that are sampled: up to
	// three tries.
	var busy time.Duration
	for try := 0; try < 3 && busy <= idle; try++ {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 8 * runtime.GOMAXPROCS(0) {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default: // spin: preempted only by the scheduler, every 10 ms
						for i := 0; i < 1e6; i++ {
							_ = i * i
						}
					}
				}
			})
		}
		time.Sleep(300 * time.Millisecond)
		w.read()
		busy = time.Duration(w.delay.Load())
		close(stop)
		wg.Wait()
	}
	if busy <= idle || busy > maxSchedExtension {
		t.Fatalf("extension %v idle, %v with 8 goroutines per processor: want it larger when busy, at most %v", idle, busy, maxSchedExtension)
	}
	t.Logf("extension %v idle, %v busy", idle, busy)
}

// The extension is four times the upper bound of the bucket holding the
// 99th percentile of the latencies sampled since the last read, at most
// maxSchedExtension, and 0 when none were sampled; counts before the last
// read do not count.
func TestSchedulingLatencyIsFoldedFromTheHistogram(t *testing.T) {
	buckets := []float64{0, 0.001, 0.002, 0.004, 0.008, math.Inf(1)} // 5 buckets
	var w schedWatch
	w.fold([]uint64{50, 50, 50, 50, 50}, buckets) // the first read records only
	for _, tc := range []struct {
		counts []uint64
		want   time.Duration
	}{
		{[]uint64{50, 50, 50, 50, 50}, 0},                      // nothing sampled
		{[]uint64{148, 50, 50, 50, 50}, 4 * time.Millisecond},  // 98 in [0, 1 ms): 4 x 1 ms
		{[]uint64{246, 50, 50, 52, 50}, 32 * time.Millisecond}, // 98 in [0, 1 ms), 2 in [4, 8 ms): rank 99 is in the latter
		{[]uint64{345, 50, 50, 53, 50}, 4 * time.Millisecond},  // 99 in [0, 1 ms), 1 in [4, 8 ms): rank 99 is in the former
		{[]uint64{345, 50, 50, 53, 51}, maxSchedExtension},     // the one sample past the last finite bound
	} {
		w.fold(tc.counts, buckets)
		if got := time.Duration(w.delay.Load()); got != tc.want {
			t.Fatalf("after counts %v: extension %v, want %v", tc.counts, got, tc.want)
		}
	}
}

// The histogram is read at most every schedEvery, to the nanosecond.
func TestSchedulingLatencyIsReadAtMostEverySchedEvery(t *testing.T) {
	var w schedWatch
	e := int64(schedEvery)
	for _, tc := range []struct {
		now, last int64
	}{{e, e}, {2*e - 1, e}, {2 * e, 2 * e}, {2*e + 1, 2 * e}} {
		w.extension(tc.now)
		if got := w.last.Load(); got != tc.last {
			t.Fatalf("extension at %d: last read %d, want %d", tc.now, got, tc.last)
		}
	}
}
