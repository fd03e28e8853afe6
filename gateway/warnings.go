package gateway

import (
	"log/slog"
	"sync/atomic"
	"time"
)

// rareWarnings logs one warning a second at most, with the count of those
// left out: a warning that a client's requests can trigger (an upstream
// error for a malformed body) must not flood the log.
type rareWarnings struct {
	log   *slog.Logger
	last  atomic.Int64 // when one was last logged, ns
	quiet atomic.Int64 // left out since
}

func (r *rareWarnings) warn(msg string, args ...any) {
	now := time.Now().UnixNano()
	last := r.last.Load()
	if now-last < int64(time.Second) || !r.last.CompareAndSwap(last, now) {
		r.quiet.Add(1)
		return
	}
	if n := r.quiet.Swap(0); n > 0 {
		args = append(args, "alike_left_out", n)
	}
	r.log.Warn(msg, args...)
}
