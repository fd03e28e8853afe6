package storetest

import (
	"encoding/binary"
	"math"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
)

// FuzzCostAndTime fuzzes a store over costs (small, at and above the burst,
// up to math.MaxInt64) and time steps (none, tiny, a window, years) for every
// algorithm: each decision must equal package algo's. A store's test calls it
// from its own Fuzz function:
//
//	func FuzzCostAndTime(f *testing.F) { storetest.FuzzCostAndTime(f, newStore, storetest.Options{}) }
//
// The seed corpus runs in go test; run longer with
// go test ./store/memory -run '^$' -fuzz FuzzCostAndTime -fuzztime 60s.
func FuzzCostAndTime(f *testing.F, newStore Factory, o Options) {
	f.Add(uint8(0), uint16(5), []byte{0, 0, 1, 0, 0, 0, 0, 0, 0, 0})
	f.Add(uint8(1), uint16(1), []byte{0, 0, 0xff, 0xff, 0, 0, 0x40, 0, 0, 1, 0, 0, 0, 0, 2})
	f.Add(uint8(3), uint16(2), []byte{9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9})
	f.Add(uint8(4), uint16(3), []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add(uint8(5), uint16(7), []byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	f.Add(uint8(6), uint16(100), []byte{0x80, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Add(uint8(2), uint16(9), []byte{3, 0, 0, 0, 0x81, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, alg uint8, rate uint16, ops []byte) {
		resolution = max(o.Resolution, 1)
		defer func() { resolution = 1 }()
		a := sluice.Algorithms()[int(alg)%len(sluice.Algorithms())]
		// Rates that divide a second into whole microseconds, so that a
		// store counting microseconds decides exactly as algo does.
		divisors := []int64{1, 2, 4, 5, 8, 10, 16, 20, 25, 40, 50, 100, 125, 200, 250, 500, 1000}
		l := sluice.Limit{Rate: divisors[int(rate)%len(divisors)], Period: time.Second, Algorithm: a}
		if a.IsBucket() {
			l.Burst = int64(rate%7) + 1
		}
		p, err := algo.NewParams(l)
		if err != nil {
			t.Fatal(err)
		}
		clock := sluice.NewManualClock(Epoch)
		s := newStore(t, clock)
		model := algo.NewState(p)
		for i := 0; i+5 <= len(ops) && i < 5*64; i += 5 {
			op := ops[i : i+5]
			switch step := binary.LittleEndian.Uint16(op); {
			case step < 0x8000:
				advance(clock, time.Duration(step)*time.Microsecond)
			case step < 0xff00:
				advance(clock, time.Duration(int64(step&0x7fff)*p.W/1000))
			default:
				advance(clock, time.Duration(step&3)*365*24*time.Hour) // huge gaps, within int64 over 64 steps
			}
			cost := int64(op[2] % 16)
			switch {
			case op[3]&0x80 != 0:
				cost = math.MaxInt64 - int64(op[4])
			case op[3]&0x40 != 0:
				cost = int64(1)<<(62-op[4]%8) + int64(op[2])
			}
			var want algo.Result
			model.Take(clock.Now(), cost, &want)
			d := take1(t, s, "fuzz", "k", l, cost)
			if !sameDecision(d, want) {
				t.Fatalf("%v, op %d (cost %d): store %+v, algo %+v", l, i/5, cost, d, want)
			}
			if cost > l.Capacity() && (d.Allowed || d.Reason != sluice.ReasonTooLarge) {
				t.Fatalf("%v: cost %d over the burst answered %+v", l, cost, d)
			}
		}
	})
}
