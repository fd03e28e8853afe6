package engine

import (
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
