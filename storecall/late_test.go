package storecall

import (
	"testing"
	"time"
)

// Graced calls are bounded: past maxGraced at once, a call ends at its
// deadline as before, and the count of running calls goes back to zero.
func TestGracedCallsAreBounded(t *testing.T) {
	c, s := newClient(t, Options{Timeout: 20 * time.Millisecond, BreakerFailures: 1 << 20})
	c.workers.n.Store(maxGraced) // as if maxGraced workers were busy
	release := s.hold()
	_, err := take(c, "x")
	release()
	if err == nil || c.Owed().LateAnswered != 0 {
		t.Fatalf("a call past the bound: %v, %+v", err, c.Owed())
	}
	time.Sleep(10 * time.Millisecond)
	if o := c.Owed(); o.LateAnswered+o.LateLost != 0 {
		t.Fatalf("a call past the bound was graced: %+v", o)
	}
	if n := c.workers.n.Load(); n != maxGraced {
		t.Fatalf("%d workers counted after a call past the bound, want %d: the count drifts", n, maxGraced)
	}
	// One below the bound, a call is still followed: the bound is
	// maxGraced workers, not one less.
	c.workers.n.Store(maxGraced - 1)
	release = s.hold()
	take(c, "x")
	release()
	waitLate(t, c, 1)
	if o := c.Owed(); o.LateAnswered != 1 {
		t.Fatalf("the call that made maxGraced workers was not followed: %+v", o)
	}
	for deadline := time.Now().Add(10 * time.Second); c.workers.n.Load() != maxGraced-1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d workers after the followed call ended, want %d", c.workers.n.Load(), maxGraced-1)
		}
	}
	// Calls one after another, each made once the last one's worker has
	// parked, run on that one worker: a parked worker is taken, not a new
	// one started. (Whether a worker parks before the next call arrives is
	// the scheduler's business, so the test waits for it.) The worker,
	// done, counts itself idle once: a dispatcher's claim takes exactly one
	// idle worker, so idle never drifts from the truth.
	c.workers.n.Store(0)
	for call := range 5 {
		take(c, "x")
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			running, idle := c.Workers()
			if running == 1 && idle == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after call %d: %d workers, %d idle; want 1 and 1", call+1, running, idle)
			}
		}
	}
}
