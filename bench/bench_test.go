package bench

import (
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// randomKeys returns n distinct keys ("user:<n>") in a shuffled order.
func randomKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "user:" + strconv.Itoa(i)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(n, func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	return keys
}

const manyKeys = 1_000_000

var (
	keysOnce []string
	sink     atomic.Int64
)

func manyRandomKeys() []string {
	if keysOnce == nil {
		keysOnce = randomKeys(manyKeys)
	}
	return keysOnce
}

// BenchmarkHotKey: every take on one key, the worst case for contention.
func BenchmarkHotKey(b *testing.B) {
	for _, c := range contenders() {
		b.Run(c.name+"/seq", func(b *testing.B) {
			l, done := c.make(1, busy)
			defer done()
			runtime.GC() // start clean of the previous contender's garbage
			n := 0
			for b.Loop() {
				if l.Allow("hot") {
					n++
				}
			}
			sink.Add(int64(n))
		})
		b.Run(c.name+"/par", func(b *testing.B) {
			l, done := c.make(1, busy)
			defer done()
			runtime.GC()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				n := 0
				for pb.Next() {
					if l.Allow("hot") {
						n++
					}
				}
				sink.Add(int64(n))
			})
		})
	}
}

// BenchmarkRandomKeys: 1M distinct keys taken in random order, after one warm
// pass, so every take finds its key present (the steady state of a busy
// service).
func BenchmarkRandomKeys(b *testing.B) {
	keys := manyRandomKeys()
	for _, c := range contenders() {
		b.Run(c.name+"/seq", func(b *testing.B) {
			l, done := c.make(len(keys), busy)
			defer done()
			for _, k := range keys {
				l.Allow(k)
			}
			runtime.GC()
			i, n := 0, 0
			for b.Loop() {
				if l.Allow(keys[i]) {
					n++
				}
				if i++; i == len(keys) {
					i = 0
				}
			}
			sink.Add(int64(n))
		})
		b.Run(c.name+"/par", func(b *testing.B) {
			l, done := c.make(len(keys), busy)
			defer done()
			for _, k := range keys {
				l.Allow(k)
			}
			runtime.GC()
			var start atomic.Int64
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(start.Add(int64(len(keys)/7))) % len(keys)
				n := 0
				for pb.Next() {
					if l.Allow(keys[i]) {
						n++
					}
					if i++; i == len(keys) {
						i = 0
					}
				}
				sink.Add(int64(n))
			})
		})
	}
}

// BenchmarkMemoryPerKey reports the heap bytes each limiter holds per live
// key after n distinct keys, each made fresh (as a request's key would be),
// so a store that keeps its keys pays for them. Run with -benchtime=1x.
// SLUICE_BENCH_10M=1 adds the 10M-key size.
func BenchmarkMemoryPerKey(b *testing.B) {
	sizes := []int{1_000_000}
	if os.Getenv("SLUICE_BENCH_10M") != "" {
		sizes = append(sizes, 10_000_000)
	}
	for _, n := range sizes {
		for _, c := range contenders() {
			if c.name == "sluice-gcra-coarse" {
				continue // same table as sluice-gcra
			}
			b.Run(c.name+"/"+strconv.Itoa(n/1_000_000)+"M", func(b *testing.B) {
				for b.Loop() {
					b.ReportMetric(heapPerKey(c, n), "B/key")
				}
			})
		}
	}
}

func heapPerKey(c contender, n int) float64 {
	var before, after runtime.MemStats
	settle()
	runtime.ReadMemStats(&before)
	l, done := c.make(n, lasting)
	buf := make([]byte, 0, 32)
	for i := range n {
		buf = strconv.AppendInt(append(buf[:0], "user:"...), int64(i), 10)
		l.Allow(string(buf))
	}
	settle()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(l)
	done()
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
}

// settle collects garbage until the heap stops shrinking, so that stores
// freed by finalizers (ulule's janitor stops in one) are gone before a
// measurement.
func settle() {
	var m runtime.MemStats
	last := uint64(0)
	for range 5 {
		runtime.GC()
		time.Sleep(10 * time.Millisecond) // let finalizers run
		runtime.ReadMemStats(&m)
		if m.HeapAlloc == last {
			return
		}
		last = m.HeapAlloc
	}
}
