package rules

import (
	"fmt"
	"strings"
	"time"

	"github.com/sluice-rl/sluice"
)

// Summary describes the rule in one line, for `sluice check`: what it
// matches, its key, and its limit in words.
func (r *Rule) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: ", r.ID)
	if r.Shadow {
		b.WriteString("[shadow] ")
	}
	if r.Envoy != nil {
		b.WriteString("envoy domain ")
		b.WriteString(r.Envoy.Domain)
		for _, e := range r.Envoy.Entries {
			b.WriteString(" " + e.Key + "=")
			if e.Value == "" {
				b.WriteString("(each value)")
			} else {
				b.WriteString(e.Value)
			}
		}
	} else {
		b.WriteString(r.Match.String())
		b.WriteString(", per ")
		names := make([]string, len(r.Key))
		for i, s := range r.Key {
			names[i] = s.Name
		}
		b.WriteString(strings.Join(names, "+"))
	}
	b.WriteString(": ")
	if r.Unlimited {
		b.WriteString("unlimited")
	} else {
		b.WriteString(Ceiling(r.Limit))
	}
	if r.Cost != 1 {
		fmt.Fprintf(&b, "; each request costs %d", r.Cost)
	}
	if len(r.CountOn) > 0 {
		fmt.Fprintf(&b, "; only responses %v count", r.CountOn)
	}
	if r.Penalty != nil {
		fmt.Fprintf(&b, "; locked for %s after %d rejections", periodWords(r.Penalty.Block), r.Penalty.After)
	}
	if r.FailClosed {
		b.WriteString("; fails closed")
	}
	fmt.Fprintf(&b, " (%s)", r.Limit.Algorithm)
	return b.String()
}

// String describes the match in words.
func (m *Match) String() string {
	var parts []string
	if len(m.Methods) > 0 {
		parts = append(parts, strings.Join(m.Methods, "|"))
	}
	if len(m.Paths) > 0 {
		ps := make([]string, len(m.Paths))
		for i, p := range m.Paths {
			ps[i] = p.String()
		}
		parts = append(parts, strings.Join(ps, "|"))
	}
	if len(m.Hosts) > 0 {
		parts = append(parts, "on "+strings.Join(m.Hosts, "|"))
	}
	if len(parts) == 0 {
		return "every request"
	}
	return strings.Join(parts, " ")
}

// Ceiling states a limit's burst ceiling in words: "at most 20 at once, then
// 100 per minute" for the bucket family (over any interval t, at most
// b + r*t), or the window's guarantee for the window algorithms.
func Ceiling(l sluice.Limit) string {
	per := periodWords(l.Period)
	switch l.Algorithm {
	case sluice.FixedWindow:
		return fmt.Sprintf("at most %d per %s window (up to %d across a window boundary)", l.Rate, per, 2*l.Rate)
	case sluice.SlidingLog:
		return fmt.Sprintf("at most %d in any %s", l.Rate, per)
	case sluice.SlidingWindow:
		return fmt.Sprintf("about %d per sliding %s (at most %d per aligned window)", l.Rate, per, l.Rate)
	case sluice.LeakyQueue:
		return fmt.Sprintf("at most %d queued, sent at %d per %s", l.Capacity(), l.Rate, per)
	}
	return fmt.Sprintf("at most %d at once, then %d per %s", l.Capacity(), l.Rate, per)
}

// periodWords writes a period as "minute", "15 minutes", "500 milliseconds".
func periodWords(d time.Duration) string {
	units := []struct {
		d    time.Duration
		name string
	}{{24 * time.Hour, "day"}, {time.Hour, "hour"}, {time.Minute, "minute"}, {time.Second, "second"}, {time.Millisecond, "millisecond"}}
	for _, u := range units {
		if d%u.d == 0 {
			n := d / u.d
			if n == 1 {
				return u.name
			}
			return fmt.Sprintf("%d %ss", n, u.name)
		}
	}
	return d.String()
}
