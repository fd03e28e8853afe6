package storecall

import (
	"math"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// A gateway whose own CPU is saturated (three busy loops on two cores, or
// the traffic spike a limiter exists for) answers a store call late because
// its goroutines wait to run, not because the store is slow: the reply is
// in its socket, unread. Taken for a store failure, such a miss would
// degrade answers on a healthy store and open its breaker. So the store's
// deadline is extended by how long this process's goroutines have lately
// waited to run: four times the 99th percentile of Go's scheduling latency
// (runtime/metrics "/sched/latencies:seconds") over the last interval,
// read at most every schedEvery. A hung store is then found later while the
// process is starved, and as soon as it is not.
type schedWatch struct {
	last  atomic.Int64 // when the histogram was last read, ns
	delay atomic.Int64 // four times the recent p99, ns

	mu      sync.Mutex
	sample  []metrics.Sample
	prev    []uint64
	buckets []float64
}

// schedEvery is how often the scheduling latency is read.
const schedEvery = 100 * time.Millisecond

// maxSchedExtension bounds what the scheduling latency adds to a deadline.
const maxSchedExtension = 2 * time.Second

// extension returns what the deadline of a call starting at now gets for
// the process's own scheduling latency.
func (w *schedWatch) extension(now int64) time.Duration {
	if last := w.last.Load(); now-last >= int64(schedEvery) && w.last.CompareAndSwap(last, now) {
		w.read()
	}
	return time.Duration(w.delay.Load())
}

// read folds the histogram's counts since the last read into the delay.
func (w *schedWatch) read() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.sample == nil {
		w.sample = []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	}
	metrics.Read(w.sample)
	if w.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return // not offered by this runtime: no extension
	}
	h := w.sample[0].Value.Float64Histogram()
	w.fold(h.Counts, h.Buckets)
}

// fold folds a cumulative histogram's counts since the last fold into the
// delay: four times the upper bound of the bucket that holds their 99th
// percentile (the count at rank total - total/100), at most
// maxSchedExtension; 0 when nothing was sampled. The first fold only
// records the counts. w.mu is held.
func (w *schedWatch) fold(counts []uint64, buckets []float64) {
	if w.prev == nil || len(w.prev) != len(counts) {
		w.prev = append(w.prev[:0], counts...)
		w.buckets = buckets
		return
	}
	var total uint64
	for i, c := range counts {
		total += c - w.prev[i]
	}
	p99 := 0.0
	if total > 0 {
		rank := total - total/100 // the count at or below the 99th percentile
		var seen uint64
		for i, c := range counts {
			if seen += c - w.prev[i]; seen >= rank {
				p99 = w.buckets[i+1] // the bucket's upper bound
				break
			}
		}
	}
	copy(w.prev, counts)
	if math.IsInf(p99, 0) || math.IsNaN(p99) {
		p99 = maxSchedExtension.Seconds()
	}
	ext := min(time.Duration(4*p99*float64(time.Second)), maxSchedExtension)
	w.delay.Store(int64(ext))
}
