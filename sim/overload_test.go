package sim

import (
	"fmt"
	"testing"
)

// Past capacity the unprotected backend's goodput collapses, and a fixed
// rate at the nominal capacity does not save it (contention lowers the real
// capacity); a concurrency limit, fixed or adaptive, keeps goodput up and
// sheds the excess. Below capacity every contender admits everything. The
// run is deterministic.
func TestOverloadShowsWhatBoundsInFlightDoes(t *testing.T) {
	rep, err := Overload()
	if err != nil {
		t.Fatal(err)
	}
	res := rep.JSON.(*OverloadResult)
	at := map[string]OverloadRow{}
	for _, r := range res.Rows {
		at[fmt.Sprint(r.Contender, "@", r.Load)] = r
	}
	if len(at) != 30 {
		t.Fatalf("%d rows, want 5 contenders x 6 loads", len(at))
	}
	capacity := res.CapacityPerSecond
	for _, c := range []string{"no limiter", "fixed rate", "fixed concurrency", "AIMD", "Gradient2"} {
		low := at[c+"@0.5"]
		if low.Shed != 0 || low.Goodput < 0.95*low.Offered {
			t.Errorf("%s at 0.5x: %+v, want everything admitted and done in time", c, low)
		}
	}
	for _, c := range []string{"no limiter", "fixed rate"} {
		if r := at[c+"@3"]; r.Goodput > 0.1*capacity {
			t.Errorf("%s at 3x: goodput %.0f/s, want the collapse (< 10%% of %.0f)", c, r.Goodput, capacity)
		}
	}
	for _, c := range []string{"fixed concurrency", "AIMD", "Gradient2"} {
		r := at[c+"@3"]
		if r.Goodput < 0.35*capacity || r.Shed < 0.5*r.Offered {
			t.Errorf("%s at 3x: %+v, want goodput above 35%% of %.0f and the excess shed", c, r, capacity)
		}
	}
	again, _ := Overload()
	if fmt.Sprint(again.Rows) != fmt.Sprint(rep.Rows) {
		t.Error("two runs differ")
	}
}
