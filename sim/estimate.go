package sim

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/memory"
)

// EstimateSpec is what `sluice estimate` is asked.
type EstimateSpec struct {
	Keys   int64        // users, API keys, addresses... in all
	Active float64      // the share of Keys active within one window (0 < Active <= 1)
	Limit  sluice.Limit // the rule; its Algorithm is ignored: every one is estimated
	// Sample is how many keys the measurement inserts (default 100,000;
	// 10,000 for the sliding log, whose keys are larger).
	Sample int
	// Redis, if set, measures the bytes per key of a Redis server for a
	// limit (each key at its limit), for a column of its own.
	Redis func(l sluice.Limit) (float64, error)
}

// EstimateRow is one algorithm's estimate.
type EstimateRow struct {
	Algorithm string `json:"algorithm"`
	// StateBytes is the reference's per-key state: 8 B per timestamp, 4 B
	// per counter, 8 B per time.
	StateBytes int64 `json:"stateBytes"`
	// ReferenceBytes is the reference estimate: active keys x (state + 64 B
	// of key overhead).
	ReferenceBytes int64 `json:"referenceBytes"`
	// MeasuredPerKey is sluice's embedded store, measured: heap bytes per
	// live key after inserting the sample, each key at its limit.
	MeasuredPerKey float64 `json:"measuredBytesPerKey"`
	// ExtrapolatedBytes is MeasuredPerKey x active keys.
	ExtrapolatedBytes int64 `json:"extrapolatedBytes"`
	// RedisPerKey is Redis's MEMORY USAGE per key, with --redis.
	RedisPerKey float64 `json:"redisBytesPerKey,omitempty"`
	// RedisBytes is RedisPerKey x active keys.
	RedisBytes int64 `json:"redisBytes,omitempty"`
}

// EstimateResult is the JSON form of an estimate.
type EstimateResult struct {
	Keys       int64         `json:"keys"`
	ActiveKeys int64         `json:"activeKeys"`
	Limit      string        `json:"limit"`
	Rows       []EstimateRow `json:"algorithms"`
	// Warnings say what the figures assume that a default deployment
	// would not give (active keys beyond the embedded store's bound).
	Warnings []string `json:"warnings"`
}

// referenceState is the back-of-envelope per-key state, before key overhead.
func referenceState(a sluice.Algorithm, l sluice.Limit) int64 {
	switch a {
	case sluice.SlidingLog:
		return l.Rate * 8 // one 8-byte timestamp per unit within the window
	case sluice.FixedWindow:
		return 8
	case sluice.SlidingWindow:
		return 12 // two 4-byte counters and a 4-byte window start
	case sluice.TokenBucket, sluice.LeakyMeter:
		return 16 // tokens (or level) and the last update
	}
	return 8 // GCRA's TAT; the leaky queue's next departure
}

// keyOverhead is the reference's flat per-key overhead (the key, the hash
// table entry, the TTL).
const keyOverhead = 64

// Estimate computes the back-of-envelope memory table for the spec, and measures
// sluice's embedded store on a sample to extrapolate from.
func Estimate(spec EstimateSpec) (*Report, error) {
	if spec.Keys <= 0 || spec.Active <= 0 || spec.Active > 1 {
		return nil, fmt.Errorf("sim: want keys > 0 and 0 < active <= 1")
	}
	if err := spec.Limit.Validate(); err != nil {
		return nil, err
	}
	active := int64(float64(spec.Keys) * spec.Active)
	res := &EstimateResult{Keys: spec.Keys, ActiveKeys: active, Limit: sluice.FormatPeriod(spec.Limit.Period), Warnings: []string{}}
	res.Limit = strconv.FormatInt(spec.Limit.Rate, 10) + "/" + res.Limit
	for _, a := range sluice.Algorithms() {
		l := spec.Limit
		l.Algorithm = a
		if !a.IsBucket() {
			l.Burst = 0
		}
		if a == sluice.SlidingLog && l.Rate > sluice.MaxLogLimit {
			continue
		}
		sample := spec.Sample
		if sample <= 0 {
			sample = 100_000
			if a == sluice.SlidingLog {
				sample = 10_000
			}
		}
		perKey, err := measurePerKey(l, sample)
		if err != nil {
			return nil, err
		}
		st := referenceState(a, l)
		row := EstimateRow{
			Algorithm: a.String(), StateBytes: st, ReferenceBytes: active * (st + keyOverhead),
			MeasuredPerKey: perKey, ExtrapolatedBytes: int64(perKey * float64(active)),
		}
		if spec.Redis != nil {
			if row.RedisPerKey, err = spec.Redis(l); err != nil {
				return nil, fmt.Errorf("sim: measuring Redis: %w", err)
			}
			row.RedisBytes = int64(row.RedisPerKey * float64(active))
		}
		res.Rows = append(res.Rows, row)
	}
	rep := &Report{
		Title: fmt.Sprintf("estimate: %s keys, %.3g%% active in a window = %s active keys; limit %s",
			human(spec.Keys), spec.Active*100, human(active), res.Limit),
		Columns: []string{"algorithm", "state (B)", "reference: active x (state + 64 B)", "sluice measured (B/key)", "sluice extrapolated"},
		JSON:    res,
	}
	if spec.Redis != nil {
		rep.Columns = append(rep.Columns, "Redis MEMORY USAGE (B/key)", "Redis extrapolated")
	}
	for _, r := range res.Rows {
		row := []string{r.Algorithm, strconv.FormatInt(r.StateBytes, 10), bytesWords(r.ReferenceBytes),
			strconv.FormatFloat(r.MeasuredPerKey, 'f', 1, 64), bytesWords(r.ExtrapolatedBytes)}
		if spec.Redis != nil {
			row = append(row, strconv.FormatFloat(r.RedisPerKey, 'f', 1, 64), bytesWords(r.RedisBytes))
		}
		rep.Rows = append(rep.Rows, row)
	}
	if active > memory.DefaultMaxKeys {
		// The embedded store would not hold them: say so before the figures
		// are believed.
		w := fmt.Sprintf("Warning: %s active keys exceed the embedded store's bound of %s keys per rule (--max-keys): it would evict the most idle (never a limited one) and count the rest in a shared, strict overflow state. Raise --max-keys to at least %d (the extrapolated bytes above), or keep the counts in Redis.",
			human(active), human(memory.DefaultMaxKeys), active)
		res.Warnings = append(res.Warnings, w)
		rep.Notes = append(rep.Notes, w)
	}
	if spec.Redis != nil {
		rep.Notes = append(rep.Notes, "Redis: MEMORY USAGE (the key, its value and their administrative overheads) of keys written by sluice's Redis store, each at its limit, averaged over 200 keys.")
	}
	rep.Notes = append(rep.Notes,
		"Reference: the usual back-of-envelope assumptions: 8 B per timestamp, 4 B per counter, 64 B of key overhead per key; only keys active within their window need state.",
		"Measured: sluice's embedded store, heap bytes per live key after inserting the sample (each key at its limit), extrapolated linearly to the active keys; tables double at 3/4 full, so real figures vary by up to 2x with the key count.")
	return rep, nil
}

// measurePerKey inserts n keys, each taken to its limit, and returns the heap
// bytes per key they hold.
func measurePerKey(l sluice.Limit, n int) (float64, error) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := memory.New(memory.WithMaxKeys(2 * n))
	lim, err := s.Limiter("estimate", l)
	if err != nil {
		return 0, err
	}
	fill := min(l.Capacity(), 1<<16)
	buf := make([]byte, 0, 24)
	for i := range n {
		buf = strconv.AppendInt(append(buf[:0], "key:"...), int64(i), 10)
		lim.Take(string(buf), fill)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(lim)
	return max(0, float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(n)), nil
}

// ParseCount reads "10M", "1.5k", "250000".
func ParseCount(s string) (int64, error) {
	mult := 1.0
	switch {
	case strings.HasSuffix(s, "k") || strings.HasSuffix(s, "K"):
		mult, s = 1e3, s[:len(s)-1]
	case strings.HasSuffix(s, "M"):
		mult, s = 1e6, s[:len(s)-1]
	case strings.HasSuffix(s, "G") || strings.HasSuffix(s, "B"):
		mult, s = 1e9, s[:len(s)-1]
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f <= 0 || f*mult > 1e15 {
		return 0, fmt.Errorf("%q is not a count such as 10M, 1.5k or 250000", s)
	}
	return int64(f * mult), nil
}

func human(n int64) string {
	switch {
	case n >= 1e9:
		return strconv.FormatFloat(float64(n)/1e9, 'g', 4, 64) + "G"
	case n >= 1e6:
		return strconv.FormatFloat(float64(n)/1e6, 'g', 4, 64) + "M"
	case n >= 1e3:
		return strconv.FormatFloat(float64(n)/1e3, 'g', 4, 64) + "k"
	}
	return strconv.FormatInt(n, 10)
}

func bytesWords(b int64) string {
	switch {
	case b >= 1e9:
		return strconv.FormatFloat(float64(b)/1e9, 'f', 2, 64) + " GB"
	case b >= 1e6:
		return strconv.FormatFloat(float64(b)/1e6, 'f', 1, 64) + " MB"
	case b >= 1e3:
		return strconv.FormatFloat(float64(b)/1e3, 'f', 1, 64) + " kB"
	}
	return strconv.FormatInt(b, 10) + " B"
}
