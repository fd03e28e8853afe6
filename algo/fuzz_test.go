package algo

import (
	"encoding/binary"
	"slices"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
)

// fuzzTraffic turns fuzz input into a limit and a monotone sequence of takes.
type event struct{ now, cost int64 }

func fuzzTraffic(t *testing.T, alg, rate uint8, period uint32, burst uint8, ops []byte) (Params, []event, bool) {
	l := sluice.Limit{
		Algorithm: sluice.Algorithm(alg % 7),
		Rate:      1 + int64(rate%40),
		Period:    time.Duration(1+period%uint32(time.Hour/time.Microsecond)) * time.Microsecond,
	}
	if l.Algorithm.IsBucket() {
		l.Burst = int64(burst % 50)
	}
	p, err := NewParams(l)
	if err != nil {
		return p, nil, false
	}
	now := int64(1_700_000_000_000_000_000)
	var evs []event
	for len(ops) >= 5 && len(evs) < 400 {
		gap := int64(binary.LittleEndian.Uint32(ops)) % (3 * max(p.W, p.D, 1))
		if ops[4]&0x80 != 0 {
			gap = 0 // bursts at one instant
		}
		now += gap
		evs = append(evs, event{now, int64(ops[4]&0x7f) % (p.Burst + 2)})
		ops = ops[5:]
	}
	return p, evs, true
}

func addFuzzSeeds(f *testing.F) {
	f.Add(uint8(0), uint8(4), uint32(1_000_000), uint8(5), []byte("\x00\x00\x00\x00\x81\x00\x00\x00\x00\x81\x10\x27\x00\x00\x01"))
	for a := range uint8(7) {
		f.Add(a, uint8(9), uint32(60_000_000), uint8(20), []byte("\xff\x00\x00\x00\x02\x00\x00\x00\x00\x83\x01\x00\x00\x00\x01\x00\x10\x00\x00\x05"))
	}
}

// FuzzMatchesReference: the fast implementations agree with the reference
// models on any traffic.
func FuzzMatchesReference(f *testing.F) {
	addFuzzSeeds(f)
	f.Fuzz(func(t *testing.T, alg, rate uint8, period uint32, burst uint8, ops []byte) {
		p, evs, ok := fuzzTraffic(t, alg, rate, period, burst, ops)
		if !ok || len(evs) > 150 {
			return
		}
		ref, got := newReference(p), newFast(p)
		for i, e := range evs {
			if want, have := ref.take(e.now, e.cost), got.take(e.now, e.cost); want != have {
				t.Fatalf("step %d take(%d, %d) with %+v: got %+v, want %+v", i, e.now, e.cost, p, have, want)
			}
		}
	})
}

// FuzzBurstCeiling: the invariants each algorithm promises, on any traffic.
//   - token-bucket, leaky-meter, gcra: at most b + t/T units in any closed
//     interval of length t;
//   - leaky-queue: at most b+1 + t/T admitted in any interval (b waiting plus
//     the one leaving), and units leave at least T apart;
//   - sliding-log: at most L units in any window-long interval (t-W, t];
//   - fixed-window and sliding-window: at most L units in any aligned window.
func FuzzBurstCeiling(f *testing.F) {
	addFuzzSeeds(f)
	f.Fuzz(func(t *testing.T, alg, rate uint8, period uint32, burst uint8, ops []byte) {
		p, evs, ok := fuzzTraffic(t, alg, rate, period, burst, ops)
		if !ok {
			return
		}
		impl := newFast(p)
		var admitted []event // cost > 0 only
		var departures []int64
		for _, e := range evs {
			r := impl.take(e.now, e.cost)
			if r.Allowed && e.cost > 0 {
				admitted = append(admitted, e)
			}
			if r.Allowed && p.Algorithm == sluice.LeakyQueue {
				for u := range e.cost {
					departures = append(departures, e.now+r.Delay-(e.cost-1-u)*p.T)
				}
			}
		}
		for i := range admitted {
			sum := int64(0)
			for j := i; j < len(admitted); j++ {
				sum += admitted[j].cost
				span := admitted[j].now - admitted[i].now
				var ceiling int64
				switch p.Algorithm {
				case sluice.GCRA, sluice.TokenBucket, sluice.LeakyMeter:
					ceiling = p.Burst + span/p.T
				case sluice.LeakyQueue:
					ceiling = p.Burst + 1 + span/p.T
				case sluice.SlidingLog:
					if span >= p.W {
						continue
					}
					ceiling = p.Burst
				case sluice.FixedWindow, sluice.SlidingWindow:
					if windowStart(admitted[i].now, p.W) != windowStart(admitted[j].now, p.W) {
						continue
					}
					ceiling = p.Burst
				}
				if sum > ceiling {
					t.Fatalf("%v %+v: %d units in [%d, %d], ceiling %d", p.Algorithm, p, sum, admitted[i].now, admitted[j].now, ceiling)
				}
			}
		}
		slices.Sort(departures)
		for i := 1; i < len(departures); i++ {
			if departures[i]-departures[i-1] < p.T {
				t.Fatalf("leaky-queue units left %dns apart, T = %d", departures[i]-departures[i-1], p.T)
			}
		}
	})
}
