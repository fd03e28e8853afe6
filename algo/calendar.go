package algo

import (
	"math"
	"time"

	"github.com/sluice-rl/sluice"
)

// window returns the start and end (exclusive) of the fixed window that
// holds t (Unix nanoseconds): W-long windows aligned to the epoch, or with
// p.Calendar the UTC calendar's day, week (from Monday), month or year. A
// calendar month is 28 to 31 days, a year 365 or 366: the windows follow
// the calendar, so a quota of 1,000 a month resets on the 1st, whatever the
// month's length. Times beyond the calendar's range (year 1 to 9999, far
// wider than any clock) fall back to W-long windows.
func (p *Params) window(t int64) (start, end int64) {
	if p.Calendar != 0 {
		if s, e, ok := calendarWindow(t, p.Calendar); ok {
			return s, e
		}
	}
	start = windowStart(t, p.W)
	return start, AddSat(start, p.W)
}

// calendar bounds: the years time.Time round-trips Unix nanoseconds in.
var calMin, calMax = time.Date(1678, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano(), time.Date(2261, 12, 1, 0, 0, 0, 0, time.UTC).UnixNano()

func calendarWindow(t int64, unit time.Duration) (start, end int64, ok bool) {
	if t < calMin || t >= calMax || t == math.MaxInt64 {
		return 0, 0, false
	}
	u := time.Unix(0, t).UTC()
	y, m, d := u.Date()
	var s, e time.Time
	switch unit {
	case sluice.CalendarDay:
		s = time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
		e = s.AddDate(0, 0, 1)
	case sluice.CalendarWeek:
		back := (int(u.Weekday()) + 6) % 7 // days since Monday
		s = time.Date(y, m, d-back, 0, 0, 0, 0, time.UTC)
		e = s.AddDate(0, 0, 7)
	case sluice.CalendarMonth:
		s = time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
		e = s.AddDate(0, 1, 0)
	case sluice.CalendarYear:
		s = time.Date(y, 1, 1, 0, 0, 0, 0, time.UTC)
		e = s.AddDate(1, 0, 0)
	default:
		return 0, 0, false
	}
	return s.UnixNano(), e.UnixNano(), true
}
