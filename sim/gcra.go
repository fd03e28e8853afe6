package sim

import (
	"strconv"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
)

// Outcome is one algorithm's answer to one request.
type Outcome struct {
	Allowed      bool  `json:"allowed"`
	Remaining    int64 `json:"remaining"`
	RetryAfterMs int64 `json:"retryAfterMs"`
}

// GCRAVsTokenBucketRow is one request of the gcra-vs-token-bucket scenario.
type GCRAVsTokenBucketRow struct {
	T           float64 `json:"t"`
	GCRA        Outcome `json:"gcra"`
	TokenBucket Outcome `json:"tokenBucket"`
}

// GCRAVsTokenBucketResult is the JSON form of the scenario.
type GCRAVsTokenBucketResult struct {
	Requests []GCRAVsTokenBucketRow `json:"requests"`
	Agree    bool                   `json:"agree"`
}

// GCRAVsTokenBucket runs the textbook example, r = 2/s and b = 5: six requests
// at t = 0, one at 0.5 s and one at 1.0 s, through GCRA and a token bucket.
func GCRAVsTokenBucket() (*Report, error) {
	l := sluice.Limit{Rate: 2, Period: time.Second, Burst: 5}
	l.Algorithm = sluice.GCRA
	pg, err := algo.NewParams(l)
	if err != nil {
		return nil, err
	}
	l.Algorithm = sluice.TokenBucket
	pt, err := algo.NewParams(l)
	if err != nil {
		return nil, err
	}
	var g algo.GCRA
	tb := pt.NewTokenBucket(0)
	times := []time.Duration{0, 0, 0, 0, 0, 0, 500 * time.Millisecond, time.Second}

	res := GCRAVsTokenBucketResult{Agree: true}
	rep := &Report{
		Title:   "gcra-vs-token-bucket: r = 2/s, b = 5 (T = 0.5 s, tau = 2 s)",
		Columns: []string{"#", "t (s)", "gcra", "gcra remaining", "gcra retry (ms)", "token-bucket", "token-bucket remaining", "token-bucket retry (ms)"},
		Chart:   &Chart{Y: []string{"gcra remaining", "token-bucket remaining"}, YLabel: "remaining after the request"},
	}
	for i, at := range times {
		var rg, rt algo.Result
		g = g.Take(&pg, int64(at), 1, &rg)
		tb = tb.Take(&pt, int64(at), 1, &rt)
		row := GCRAVsTokenBucketRow{T: at.Seconds(), GCRA: outcome(rg), TokenBucket: outcome(rt)}
		res.Agree = res.Agree && row.GCRA == row.TokenBucket
		res.Requests = append(res.Requests, row)
		rep.Rows = append(rep.Rows, []string{
			strconv.Itoa(i + 1), strconv.FormatFloat(row.T, 'f', 1, 64),
			verdict(rg.Allowed), strconv.FormatInt(rg.Remaining, 10), strconv.FormatInt(row.GCRA.RetryAfterMs, 10),
			verdict(rt.Allowed), strconv.FormatInt(rt.Remaining, 10), strconv.FormatInt(row.TokenBucket.RetryAfterMs, 10),
		})
	}
	if res.Agree {
		rep.Notes = append(rep.Notes, "The two algorithms agree on every request.")
	} else {
		rep.Notes = append(rep.Notes, "The two algorithms DISAGREE: this is a bug.")
	}
	rep.JSON = res
	return rep, nil
}

func outcome(r algo.Result) Outcome {
	return Outcome{Allowed: r.Allowed, Remaining: r.Remaining, RetryAfterMs: time.Duration(r.RetryAfter).Milliseconds()}
}

func verdict(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "rejected"
}
