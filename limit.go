package sluice

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// Limit is a rate limit as its author writes it: Rate units per Period, a
// Burst, and the Algorithm that enforces it.
//
// For the bucket family (see [Algorithm.IsBucket]) the bucket holds Burst
// units and refills at Rate per Period; each unit takes the emission interval
// T = Period/Rate, rounded up to a whole nanosecond so that rounding can only
// make the limit stricter, never looser (by less than one nanosecond per unit).
// For the window algorithms the window is Period long and admits Rate units;
// Burst must then be unset or equal to Rate.
type Limit struct {
	Rate      int64         // units admitted per Period; > 0
	Period    time.Duration // > 0
	Burst     int64         // bucket capacity; 0 means Rate
	Algorithm Algorithm     // zero value is GCRA
	// Calendar aligns a fixed window to the UTC calendar instead of to
	// multiples of Period since the Unix epoch: a day from midnight, a week
	// (7d) from Monday, a month (mo) from the 1st, a year (y) from
	// January 1st. A month or a year is then as long as it is on the
	// calendar (28 to 31 days; 365 or 366). Only for fixed-window limits of
	// one day, week, month or year.
	Calendar bool
	// Portion, above 0, makes the limit a global one that regions share,
	// each deciding on its own store: it is this region's own share of it,
	// in thousandths (1 to 1000). A key is then the region's part of the
	// limit (package global), a token bucket whose share the region's agent
	// moves to where demand is; a fresh key holds the own share, full.
	// Only for token-bucket limits.
	Portion int64
}

// Calendar units a calendar-aligned fixed window may have (see
// Limit.Calendar).
const (
	CalendarDay   = 24 * time.Hour
	CalendarWeek  = 7 * CalendarDay
	CalendarMonth = 30 * CalendarDay // the "mo" unit
	CalendarYear  = 365 * CalendarDay
)

// Bounds the validation enforces, so that every computation in package algo
// fits in an int64 without overflow.
const (
	// MaxCapacity bounds Burst*T (the time a bucket takes to refill from
	// empty) and the window length: about 36 years. A quarter of the int64
	// range is left free so sums of two such values cannot overflow.
	MaxCapacity = time.Duration(math.MaxInt64 / 4)
	// MaxLogLimit bounds the Rate of a sliding-log limit, which keeps one
	// 8-byte timestamp per admitted unit in each key's window.
	MaxLogLimit = 1 << 20
)

// ErrInvalidLimit is wrapped by every error that [Limit.Validate] returns.
var ErrInvalidLimit = errors.New("invalid limit")

// Capacity returns the effective burst: Burst, or Rate when Burst is 0.
func (l Limit) Capacity() int64 {
	if l.Burst == 0 {
		return l.Rate
	}
	return l.Burst
}

// Share returns l divided among n parties (gateways, shards): rate and
// burst divided by n, rounded down but at least 1, so that n parties each
// enforcing the share together admit at most l (when n <= the rate), never
// n times it. Share(1) is l.
func (l Limit) Share(n int) Limit {
	if n <= 1 {
		return l
	}
	s := l
	s.Rate = max(l.Rate/int64(n), 1)
	if l.Burst > 0 {
		s.Burst = max(l.Burst/int64(n), 1)
	}
	if !s.Algorithm.IsBucket() {
		s.Burst = 0
	}
	return s
}

// Part returns the limit that a fraction f of l admits, for a region's
// share: its rate and burst times f, rounded down, at least 1. f outside
// (0, 1) leaves l whole.
func (l Limit) Part(f float64) Limit {
	if f <= 0 || f >= 1 {
		return l
	}
	s := l
	s.Rate = max(int64(float64(l.Rate)*f), 1)
	if l.Burst > 0 {
		s.Burst = max(int64(float64(l.Burst)*f), 1)
	}
	return s
}

// Interval returns the emission interval T = Period/Rate rounded up to a whole
// nanosecond: the time the bucket family takes to refill one unit. It is 0 for
// a limit that does not validate.
func (l Limit) Interval() time.Duration {
	if l.Rate <= 0 || l.Period <= 0 {
		return 0
	}
	t := int64(l.Period) / l.Rate
	if int64(l.Period)%l.Rate != 0 {
		t++
	}
	return time.Duration(t)
}

// Validate reports whether l can be enforced. Rate, Period and Burst must be
// positive (Burst may be 0 for "equal to Rate"), the rate at most one unit per
// nanosecond, Burst*T and Period at most [MaxCapacity], a sliding-log Rate at
// most [MaxLogLimit], and a window algorithm's Burst unset or equal to Rate.
func (l Limit) Validate() error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidLimit, fmt.Sprintf(format, args...))
	}
	switch {
	case !l.Algorithm.Valid():
		return fail("unknown algorithm %d", uint8(l.Algorithm))
	case l.Rate <= 0:
		return fail("rate must be > 0, got %d", l.Rate)
	case l.Period <= 0:
		return fail("period must be > 0, got %v", l.Period)
	case l.Burst < 0:
		return fail("burst must be >= 0 (0 means equal to rate), got %d", l.Burst)
	case l.Period > MaxCapacity:
		return fail("period %v is longer than %v", l.Period, MaxCapacity)
	case int64(l.Period) < l.Rate:
		return fail("rate %d per %v is more than one unit per nanosecond", l.Rate, l.Period)
	}
	if l.Calendar && (l.Algorithm != FixedWindow || (l.Period != CalendarDay && l.Period != CalendarWeek && l.Period != CalendarMonth && l.Period != CalendarYear)) {
		return fail("a calendar window is a fixed window of one day, week, month or year (1d, 1w, 1mo, 1y), not %v %s", FormatPeriod(l.Period), l.Algorithm)
	}
	if l.Portion != 0 && (l.Portion < 0 || l.Portion > 1000 || l.Algorithm != TokenBucket) {
		return fail("a region's portion of a global limit is 1 to 1000 thousandths of a token-bucket limit, not %d of %s", l.Portion, l.Algorithm)
	}
	if l.Algorithm.IsBucket() {
		hi, lo := bits.Mul64(uint64(l.Capacity()), uint64(l.Interval()))
		if hi != 0 || lo > uint64(MaxCapacity) {
			return fail("burst %d at one unit per %v takes longer than %v to refill", l.Capacity(), l.Interval(), MaxCapacity)
		}
		return nil
	}
	if l.Burst != 0 && l.Burst != l.Rate {
		return fail("burst %d differs from rate %d, but %s admits rate units per window and has no burst", l.Burst, l.Rate, l.Algorithm)
	}
	if l.Algorithm == SlidingLog && l.Rate > MaxLogLimit {
		return fail("sliding-log keeps one timestamp per unit; rate %d is above %d", l.Rate, MaxLogLimit)
	}
	return nil
}

// String formats l as "100/1m", followed by the burst when it differs from the
// rate and by the algorithm: "100/1m burst=20 gcra".
func (l Limit) String() string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(l.Rate, 10))
	b.WriteByte('/')
	b.WriteString(FormatPeriod(l.Period))
	if l.Burst != 0 && l.Burst != l.Rate {
		b.WriteString(" burst=")
		b.WriteString(strconv.FormatInt(l.Burst, 10))
	}
	b.WriteByte(' ')
	b.WriteString(l.Algorithm.String())
	if l.Calendar {
		b.WriteString(" calendar")
	}
	if l.Portion != 0 {
		b.WriteString(" portion=")
		b.WriteString(strconv.FormatInt(l.Portion, 10))
	}
	return b.String()
}

// ParseLimit parses "RATE/PERIOD", such as "100/1m", "10/15m" or "5/s", into a
// GCRA limit with Burst equal to Rate. See [ParsePeriod] for the period.
func ParseLimit(s string) (Limit, error) {
	rate, period, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return Limit{}, fmt.Errorf("sluice: limit %q: want RATE/PERIOD, such as 100/1m", s)
	}
	r, err := strconv.ParseInt(strings.TrimSpace(rate), 10, 64)
	if err != nil || r <= 0 {
		return Limit{}, fmt.Errorf("sluice: limit %q: rate %q is not a positive integer", s, rate)
	}
	p, err := ParsePeriod(strings.TrimSpace(period))
	if err != nil {
		return Limit{}, fmt.Errorf("sluice: limit %q: %w", s, err)
	}
	l := Limit{Rate: r, Period: p}
	if err := l.Validate(); err != nil {
		return Limit{}, fmt.Errorf("sluice: limit %q: %w", s, err)
	}
	return l, nil
}

var periodUnits = []struct {
	name string
	d    time.Duration
}{
	{"y", 365 * 24 * time.Hour}, // as envoyproxy/ratelimit's YEAR
	{"mo", 30 * 24 * time.Hour}, // as its MONTH; calendar months: see Limit.Calendar
	{"w", 7 * 24 * time.Hour},
	{"d", 24 * time.Hour},
	{"h", time.Hour},
	{"m", time.Minute},
	{"s", time.Second},
	{"ms", time.Millisecond},
}

// ParsePeriod parses a period written as an optional positive integer and one
// unit: ms, s, m, h, d, w (7 days), mo (30 days) or y (365 days), the last
// two as envoyproxy/ratelimit counts them. "15m" is fifteen minutes, "d" one
// day, "2w" a fortnight.
func ParsePeriod(s string) (time.Duration, error) {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	n := int64(1)
	if i > 0 {
		v, err := strconv.ParseInt(s[:i], 10, 64)
		if err != nil || v <= 0 {
			return 0, fmt.Errorf("period %q: count must be a positive integer", s)
		}
		n = v
	}
	unit := s[i:]
	for _, u := range periodUnits {
		if u.name == unit {
			if n > int64(MaxCapacity/u.d) {
				return 0, fmt.Errorf("period %q is longer than %v", s, MaxCapacity)
			}
			return time.Duration(n) * u.d, nil
		}
	}
	return 0, fmt.Errorf("period %q: unit must be one of ms, s, m, h, d, w (7 days), mo (30 days), y (365 days)", s)
}

// FormatPeriod writes d in the largest unit that divides it exactly, in the
// syntax [ParsePeriod] reads ("15m", "1d"); a duration that no unit divides is
// written in Go's syntax.
func FormatPeriod(d time.Duration) string {
	if d > 0 {
		for _, u := range periodUnits {
			if d%u.d == 0 {
				return strconv.FormatInt(int64(d/u.d), 10) + u.name
			}
		}
	}
	return d.String()
}
