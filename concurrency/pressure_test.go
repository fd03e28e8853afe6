package concurrency

import (
	"math"
	"sync"
	"testing"
	"time"
)

type fakeTime struct {
	mu sync.Mutex
	t  time.Time
}

func (f *fakeTime) now() time.Time { f.mu.Lock(); defer f.mu.Unlock(); return f.t }
func (f *fakeTime) add(d time.Duration) {
	f.mu.Lock()
	f.t = f.t.Add(d)
	f.mu.Unlock()
}

// The factor follows latency against the target and failures against the
// tolerated rate, never below the floor, and recovers with the service.
func TestPressureFollowsLatencyAndFailures(t *testing.T) {
	clock := &fakeTime{t: time.Unix(1_800_000_000, 0)}
	p := NewPressure(PressureOptions{Target: 100 * time.Millisecond, Floor: 0.2, Window: time.Second, Now: clock.now})
	run := func(d time.Duration, latency time.Duration, failEvery int) float64 {
		for elapsed := time.Duration(0); elapsed < d; elapsed += 10 * time.Millisecond {
			for i := range 10 {
				p.Observe(0, latency, failEvery > 0 && i%failEvery == 0)
			}
			clock.add(10 * time.Millisecond)
			p.Factor()
		}
		return p.Factor()
	}
	if f := run(5*time.Second, 50*time.Millisecond, 0); f != 1 {
		t.Fatalf("healthy: factor %v, want 1", f)
	}
	if f := run(10*time.Second, 200*time.Millisecond, 0); math.Abs(f-0.5) > 0.01 {
		t.Fatalf("twice the target latency: factor %v, want 0.5", f)
	}
	if f := run(10*time.Second, 2*time.Second, 0); f != 0.2 {
		t.Fatalf("twenty times the target: factor %v, want the floor 0.2", f)
	}
	if f := run(10*time.Second, 50*time.Millisecond, 2); math.Abs(f-0.5/0.95) > 0.01 {
		t.Fatalf("half the answers failing: factor %v, want %v", f, 0.5/0.95)
	}
	if f := run(10*time.Second, 50*time.Millisecond, 0); f != 1 {
		t.Fatalf("recovered: factor %v, want 1", f)
	}
	// No answers at all (the limits refuse everything): the factor recovers.
	run(10*time.Second, 10*time.Second, 0)
	if f := p.Factor(); f != 0.2 {
		t.Fatalf("very slow: factor %v", f)
	}
	for range 100 {
		clock.add(100 * time.Millisecond)
		p.Factor()
	}
	if f := p.Factor(); f != 1 {
		t.Fatalf("after 10 s without answers: factor %v, want 1", f)
	}
	// Smoothing: one bad tick moves the factor only part of the way.
	for range 10 {
		p.Observe(0, 2*time.Second, false)
	}
	clock.add(100 * time.Millisecond)
	if f := p.Factor(); f <= 0.5 || f >= 1 {
		t.Fatalf("after 100 ms of slow answers, factor %v: want it between 0.5 and 1", f)
	}
}

func TestPressureIsSafeForConcurrentUse(t *testing.T) {
	p := NewPressure(PressureOptions{Target: time.Millisecond, Tick: time.Microsecond})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 2000 {
				p.Observe(0, time.Duration(i)*time.Millisecond, i%2 == 0)
				if f := p.Factor(); f < 0.1 || f > 1 {
					t.Errorf("factor %v out of [0.1, 1]", f)
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestObserveAllocatesNothing(t *testing.T) {
	p := NewPressure(PressureOptions{Target: time.Millisecond})
	if n := testing.AllocsPerRun(1000, func() { p.Observe(0, time.Millisecond, false); p.Factor() }); n != 0 {
		t.Fatalf("%v allocations per observe and factor", n)
	}
}

// An operator's factor applies for its time, as a ceiling on the measured
// one, within [Floor, 1].
func TestASetFactorLastsItsTime(t *testing.T) {
	clock := &fakeTime{t: time.Unix(1_800_000_000, 0)}
	p := NewPressure(PressureOptions{Floor: 0.2, Now: clock.now})
	if got := p.Set(0.01, time.Minute); got != 0.2 {
		t.Fatalf("Set below the floor gave %v", got)
	}
	p.Set(0.5, time.Minute)
	if f := p.Factor(); f != 0.5 {
		t.Fatalf("factor %v while 0.5 is set", f)
	}
	if f, until := p.SetUntil(); f != 0.5 || !until.Equal(clock.now().Add(time.Minute)) {
		t.Fatalf("SetUntil = %v, %v", f, until)
	}
	clock.add(time.Minute)
	if f := p.Factor(); f != 1 {
		t.Fatalf("factor %v after the set one ran out", f)
	}
}

// The defaults: failures tolerated up to 5%, a floor of 0.1, a recompute
// every 100 ms, smoothing over 2 s; the first samples are taken as they
// are; failures decay when answers stop.
func TestPressureDefaults(t *testing.T) {
	clock := &fakeTime{t: time.Unix(1_800_000_000, 0)}
	p := NewPressure(PressureOptions{Now: clock.now})
	tick := func(n, failed int) float64 {
		for i := range n {
			p.Observe(0, time.Millisecond, i < failed)
		}
		clock.add(100 * time.Millisecond)
		return p.Factor()
	}
	if f := tick(100, 50); math.Abs(f-0.5/0.95) > 1e-9 {
		t.Fatalf("first tick, half failing: factor %v, want exactly %v (no smoothing yet)", f, 0.5/0.95)
	}
	// Not a tick yet: the samples wait.
	for range 100 {
		p.Observe(0, time.Millisecond, true)
	}
	clock.add(50 * time.Millisecond)
	if f := p.Factor(); math.Abs(f-0.5/0.95) > 1e-9 {
		t.Fatalf("within the tick: factor %v moved", f)
	}
	clock.add(50 * time.Millisecond)
	w := 1 - math.Exp(-0.05) // 100 ms of a 2 s window
	if f, want := p.Factor(), (1-(0.5+w*0.5))/0.95; math.Abs(f-want) > 1e-9 {
		t.Fatalf("a tick of all failing: factor %v, want %v", f, want)
	}
	for range 100 {
		tick(100, 100)
	}
	if f := p.Factor(); f != 0.1 {
		t.Fatalf("all failing for 10 s: factor %v, want the default floor 0.1", f)
	}
	for range 100 { // no answers at all: the failures decay
		clock.add(100 * time.Millisecond)
		p.Factor()
	}
	if f := p.Factor(); f != 1 {
		t.Fatalf("10 s without answers: factor %v, want 1", f)
	}
	q := NewPressure(PressureOptions{Now: clock.now})
	if tick := func(failed int) float64 {
		for i := range 100 {
			q.Observe(0, time.Millisecond, i < failed)
		}
		clock.add(100 * time.Millisecond)
		return q.Factor()
	}; tick(4) != 1 {
		t.Fatal("4% failing lowered the factor: 5% is tolerated")
	}
	q.Set(0.5, time.Second)
	clock.add(time.Second)
	if f, until := q.SetUntil(); f != 1 || !until.IsZero() {
		t.Fatalf("at its end a set factor still applies: %v until %v", f, until)
	}
}

// One client, one vote: a client whose own requests all fail (a route that
// answers it 5xx, at 50 times the others' rate) or crawl leaves the factor
// at 1 while the service answers everyone else well; when most clients see
// failures, the factor falls.
func TestOneClientCannotLowerThePressureForAll(t *testing.T) {
	clock := &fakeTime{t: time.Unix(1_800_000_000, 0)}
	p := NewPressure(PressureOptions{Target: 100 * time.Millisecond, Now: clock.now})
	tick := func(failing int) float64 {
		for range 50 { // the attacker
			p.Observe(666, 5*time.Second, true)
		}
		for c := range 4 { // four others, one answer each per tick
			p.Observe(uint64(c+1), 20*time.Millisecond, c < failing)
		}
		clock.add(100 * time.Millisecond)
		return p.Factor()
	}
	for i := range 100 {
		if f := tick(0); f != 1 {
			t.Fatalf("tick %d: one client failing alone (50 answers a tick against 4) moved the factor to %v", i, f)
		}
	}
	var f float64
	for range 100 {
		f = tick(3) // now three of the four others fail too
	}
	if f > 0.2 {
		t.Fatalf("most clients failing: factor %v, want it near the floor", f)
	}
}
