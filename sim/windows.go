package sim

import (
	"strconv"
	"time"

	"github.com/sluice-rl/sluice"
)

// WindowsCase is one case of the windows scenario: how many of each burst
// each algorithm allowed.
type WindowsCase struct {
	Name          string `json:"name"`
	FixedWindow   [2]int `json:"fixedWindow"`
	SlidingLog    [2]int `json:"slidingLog"`
	SlidingWindow [2]int `json:"slidingWindow"`
}

// WindowsResult is the JSON form of the windows scenario.
type WindowsResult struct {
	Cases []WindowsCase `json:"cases"`
}

// Windows shows the boundary effect: a limit of 100 per 60 s, two bursts of
// 100 requests 10 ms apart, at (A) 59 s and 60 s, (B) 1 s and 90 s, (C) 59 s
// and 90 s. A fixed window lets 200 through across the boundary in A; the
// sliding log never more than 100 in any 60 s.
func Windows() (*Report, error) {
	cases := []struct {
		name   string
		starts [2]float64
	}{{"A", [2]float64{59, 60}}, {"B", [2]float64{1, 90}}, {"C", [2]float64{59, 90}}}
	res := WindowsResult{}
	rep := &Report{
		Title: "windows: limit 100 per 60 s; two bursts of 100 requests 10 ms apart",
		Columns: []string{"case", "first burst (s)", "second burst (s)",
			"fixed-window first", "fixed-window second", "sliding-log first", "sliding-log second", "sliding-window first", "sliding-window second"},
		Chart: &Chart{Y: []string{"fixed-window first", "fixed-window second", "sliding-log first", "sliding-log second", "sliding-window first", "sliding-window second"}, YLabel: "admitted of each burst of 100"},
		JSON:  &res,
	}
	for _, c := range cases {
		wc := WindowsCase{Name: c.name}
		for _, alg := range []struct {
			a   sluice.Algorithm
			out *[2]int
		}{{sluice.FixedWindow, &wc.FixedWindow}, {sluice.SlidingLog, &wc.SlidingLog}, {sluice.SlidingWindow, &wc.SlidingWindow}} {
			lim, clock, err := newLimiter("w", sluice.Limit{Rate: 100, Period: time.Minute, Algorithm: alg.a})
			if err != nil {
				return nil, err
			}
			for b, start := range c.starts {
				for i := range 100 {
					clock.Set(at(start).Add(time.Duration(i) * 10 * time.Millisecond))
					if d, _ := lim.Take("k", 1); d.Allowed {
						alg.out[b]++
					}
				}
			}
		}
		res.Cases = append(res.Cases, wc)
		// One value per cell: each burst's admissions a column of its own.
		row := []string{c.name, strconv.FormatFloat(c.starts[0], 'f', -1, 64), strconv.FormatFloat(c.starts[1], 'f', -1, 64)}
		for _, p := range [][2]int{wc.FixedWindow, wc.SlidingLog, wc.SlidingWindow} {
			row = append(row, strconv.Itoa(p[0]), strconv.Itoa(p[1]))
		}
		rep.Rows = append(rep.Rows, row)
	}
	rep.Notes = append(rep.Notes, "Case A: the fixed window admits 2x the limit within about one second across its boundary; the sliding log admits nothing more until 60 s after the first burst.")
	return rep, nil
}
