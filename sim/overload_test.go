package sim

import (
	"fmt"
	"testing"
)

// Past capacity the unprotected backend's goodput collapses, and so does a
// fixed rate at the capacity once the service time doubles; a concurrency
// limit keeps goodput up and sheds the excess; with tiers, the shedding
// falls on the lowest tier while critical requests keep their success.
// Below capacity every contender admits everything. The run is
// deterministic.
func TestOverloadShowsWhatBoundsInFlightDoes(t *testing.T) {
	rep := ranReport(t, "overload") // run twice alike: TestReportsAreStableAcrossRunsInEveryFormat
	res := rep.JSON.(*OverloadResult)
	at := map[string]OverloadRow{}
	for _, r := range res.Rows {
		at[fmt.Sprint(r.Contender, "@", r.Load, map[bool]string{true: " slow"}[r.Slow])] = r
	}
	contenders := []string{"no limiter", "fixed rate", "fixed rate with tiers", "fixed concurrency", "fixed concurrency with tiers", "AIMD", "AIMD with tiers", "Gradient2", "Gradient2 with tiers", "MinRTT", "MinRTT with tiers"}
	if len(at) != len(contenders)*8 {
		t.Fatalf("%d rows, want %d contenders x 8 loads", len(at), len(contenders))
	}
	capacity := res.CapacityPerSecond
	unloadedP99 := at["no limiter@0.5"].P99Ms
	for _, c := range contenders {
		low := at[c+"@0.5"]
		if low.Goodput < 0.95*low.Offered {
			t.Errorf("%s at 0.5x: %+v, want everything done in time", c, low)
		}
	}
	for _, c := range []string{"no limiter", "fixed rate"} {
		if r := at[c+"@3"]; r.Goodput > 0.1*capacity {
			t.Errorf("%s at 3x: goodput %.0f/s, want the collapse (< 10%% of %.0f)", c, r.Goodput, capacity)
		}
	}
	// A fixed rate at the capacity, offered just the capacity: it holds
	// while the service time does, and collapses when it doubles.
	if r := at["fixed rate@1 slow"]; r.Goodput > 0.1*capacity {
		t.Errorf("fixed rate at 1x, service doubled: goodput %.0f/s, want the collapse", r.Goodput)
	}
	// The targets at 3x, met by the fixed concurrency with tiers: goodput
	// >= 90% of capacity, p99 <= 2x the unloaded p99, critical success >=
	// 99% while the sheddable tier absorbs the shedding.
	// Met by the fixed limit with tiers, and by the adaptive MinRTT with
	// tiers, which also follows a service time that doubles.
	for _, c := range []string{"fixed concurrency with tiers", "MinRTT with tiers"} {
		r := at[c+"@3"]
		if r.Goodput < 0.9*capacity || r.P99Ms > 2*unloadedP99 || r.Success[0] < 99 || r.Success[2] > 5 {
			t.Errorf("%s at 3x: %+v; want goodput >= %.0f, p99 <= %.0f ms, critical >= 99%%, sheddable shed", c, r, 0.9*capacity, 2*unloadedP99)
		}
	}
	for _, c := range []string{"fixed concurrency", "MinRTT"} {
		if r := at[c+"@3 slow"]; r.Goodput < 0.9*capacity/2 {
			t.Errorf("%s at 3x, service doubled: goodput %.0f/s, want it to follow the backend down to about %.0f", c, r.Goodput, capacity/2)
		}
	}
	for _, c := range []string{"AIMD", "Gradient2"} {
		r, tiered := at[c+"@3"], at[c+" with tiers@3"]
		if r.Goodput < 0.6*capacity || r.Shed < 0.5*r.Offered {
			t.Errorf("%s at 3x: %+v, want goodput above 60%% of %.0f and the excess shed", c, r, capacity)
		}
		if tiered.Success[0] < 2*r.Success[0] || tiered.Success[2] > 1 {
			t.Errorf("%s with tiers at 3x: success %v, without %v: want critical at least twice as served and sheddable shed", c, tiered.Success, r.Success)
		}
	}
}
