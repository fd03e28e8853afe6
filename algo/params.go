package algo

import (
	"fmt"
	"time"

	"github.com/sluice-rl/sluice"
)

// Params is a validated [sluice.Limit] in the units the algorithms compute in.
type Params struct {
	Algorithm sluice.Algorithm
	// Burst is the bucket capacity b (bucket family) or the window's limit L
	// (window algorithms), in units.
	Burst int64
	// T is the emission interval in nanoseconds: Period/Rate rounded up.
	T int64
	// D is the capacity in nanoseconds of refill time, Burst*T.
	D int64
	// W is the window length in nanoseconds: the limit's Period.
	W int64
	// Calendar, when not 0, is the calendar unit fixed windows follow
	// (sluice.CalendarDay, Week, Month or Year): see sluice.Limit.Calendar.
	Calendar time.Duration
	// Portion, when not 0, is a region's own share of a global limit, in
	// thousandths: see sluice.Limit.Portion and Portion.
	Portion int64
}

// NewParams validates l and derives its Params.
func NewParams(l sluice.Limit) (Params, error) {
	if err := l.Validate(); err != nil {
		return Params{}, fmt.Errorf("algo: %w", err)
	}
	p := Params{
		Algorithm: l.Algorithm,
		Burst:     l.Capacity(),
		T:         int64(l.Interval()),
		W:         int64(l.Period),
	}
	if l.Calendar {
		p.Calendar = l.Period
	}
	p.D = p.Burst * p.T // Validate bounds it by sluice.MaxCapacity
	p.Portion = l.Portion
	if p.Portion > 0 && !PortionFits(&p) {
		return Params{}, fmt.Errorf("algo: %w: a portion of %v counts its capacity in thousandths of share, beyond 64 bits", sluice.ErrInvalidLimit, l)
	}
	return p, nil
}

// Result is the outcome of one take, with durations in nanoseconds. It maps
// one to one onto the fields of [sluice.Decision].
type Result struct {
	Allowed    bool
	Reason     sluice.Reason
	Remaining  int64
	RetryAfter int64
	ResetAfter int64
	Delay      int64
}

// Applied makes r, the result of a take of 0 units after a change the store
// makes whatever the limit says (a charge, a refund, a settle), the answer
// to that change: allowed, and reporting the key as it stands, 0 left if it
// is in debt.
func (r *Result) Applied() {
	r.Allowed, r.Reason, r.RetryAfter = true, sluice.ReasonOK, 0
}

// A key in debt (see Charge) has less than nothing left: it reports 0.
func allowed(remaining, resetAfter int64) Result {
	return Result{Allowed: true, Remaining: max(remaining, 0), ResetAfter: resetAfter}
}

func limited(remaining, retryAfter, resetAfter int64) Result {
	return Result{Reason: sluice.ReasonLimited, Remaining: max(remaining, 0), RetryAfter: retryAfter, ResetAfter: resetAfter}
}

func tooLarge(remaining, resetAfter int64) Result {
	return Result{Reason: sluice.ReasonTooLarge, Remaining: max(remaining, 0), ResetAfter: resetAfter}
}
