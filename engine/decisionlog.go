package engine

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"sync"
	"time"
)

// DecisionLog writes decisions as structured log lines: every rejection,
// or every decision with All, one line per request naming the rule that
// decided it, the key (hashed unless the rule sets showKeys), the reason
// and the retry-after. It keeps one line in every Sample (default 1: all)
// and at most PerSecond lines a second (default 100), so that a flood of
// rejected requests cannot flood the log: what it leaves out is counted,
// and the count is logged once a second as one line ("suppressed").
//
// The limiter on its own lines is a fixed window of one second, kept under
// a mutex: a decision that is not logged costs one counter increment under
// it, and a logged one a line.
type DecisionLog struct {
	Logger    *slog.Logger
	All       bool // every decision, not only rejections
	Sample    int  // keep one in Sample (default 1)
	PerSecond int  // at most this many lines a second (default 100)

	mu         sync.Mutex
	seen       uint64 // eligible decisions, for sampling
	window     int64  // the second being counted (Unix seconds)
	logged     int    // lines written in window
	suppressed int    // lines left out since the last summary
	now        func() time.Time
}

// log writes res, if the log's settings keep it.
func (l *DecisionLog) log(res *Result, where, path string) {
	if l == nil || l.Logger == nil || (res.Allowed && !l.All) {
		return
	}
	now := time.Now
	if l.now != nil {
		now = l.now
	}
	t := now()
	l.mu.Lock()
	l.seen++
	sample := max(l.Sample, 1)
	perSecond := l.PerSecond
	if perSecond <= 0 {
		perSecond = 100
	}
	var summary int
	if sec := t.Unix(); sec != l.window {
		l.window, l.logged = sec, 0
		summary, l.suppressed = l.suppressed, 0
	}
	keep := l.seen%uint64(sample) == 0 && l.logged < perSecond
	if keep {
		l.logged++
	} else {
		l.suppressed++
	}
	l.mu.Unlock()
	if summary > 0 {
		l.Logger.Warn("sluice: decision log suppressed lines", "suppressed", summary, "per_second", perSecond, "sample", sample)
	}
	if !keep {
		return
	}
	d := &res.Decision
	attrs := []slog.Attr{
		slog.String("rule", d.Rule),
		slog.Bool("allowed", res.Allowed),
		slog.String("reason", res.Reason.String()),
		slog.Int64("retry_after_ms", d.RetryAfter.Milliseconds()),
		slog.Int64("remaining", d.Remaining),
		slog.String("via", where),
	}
	if path != "" {
		attrs = append(attrs, slog.String("method", path))
	}
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if st.Rule != d.Rule || st.Shadow {
			continue
		}
		if r := st.RuleDef(); r != nil && r.ShowKeys {
			attrs = append(attrs, slog.String("key", st.key))
		} else {
			sum := sha256.Sum256([]byte(st.key))
			attrs = append(attrs, slog.String("key_hash", hex.EncodeToString(sum[:8])))
		}
		break
	}
	if res.Degraded() {
		attrs = append(attrs, slog.Bool("degraded", true))
	}
	for _, o := range res.Overrides {
		attrs = append(attrs, slog.String("override", o.Rule+" "+o.ID+" "+string(o.Action)))
	}
	l.Logger.LogAttrs(context.Background(), slog.LevelInfo, "sluice: decision", attrs...)
}
