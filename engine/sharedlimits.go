package engine

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/overrides"
)

// The limits a key may have had (carry.go) are known to the process that
// changed them; processes on one store share them, so that one which did
// not see a change — started after it, reloading later, restarted with a
// new rule file — still names them.

// LimitHistory is implemented by a store that several processes share
// (store/redis): which limits each rule's keys were counted under lately.
// A process that did not see a limit change — it started after an override
// ended, or reloads its rules later than another — learns there the limits
// its keys may still hold state under (FollowLimits).
type LimitHistory interface {
	// Note records that each rule's keys are counted under its limits now.
	Note(ctx context.Context, limits map[string][]sluice.Limit, now time.Time) error
	// Recent returns each rule's limits and when they were last noted.
	Recent(ctx context.Context) (map[string]map[sluice.Limit]time.Time, error)
}

// FollowLimits notes in h, every interval until ctx ends, the limits this
// process counts each rule's keys under (the rules' own, and their live
// limit overrides'), and takes the others that processes noted lately as
// limits that left (for every key of their rule, as long as a key may hold
// state under them since last noted). The first round is done before it
// returns, within the interval.
func (e *Engine) FollowLimits(ctx context.Context, h LimitHistory, interval time.Duration) {
	failing := false
	round := func() time.Duration {
		rctx, cancel := context.WithTimeout(ctx, interval)
		defer cancel()
		err := e.followLimitsOnce(rctx, h, time.Now())
		switch {
		case err != nil && !failing:
			e.log.Warn("sluice: the limits the other processes count under could not be read or noted; a key whose limit changed elsewhere may start afresh here until they are", "error", err)
		case err == nil && failing:
			e.log.Info("sluice: the limits the other processes count under are read again")
		}
		failing = err != nil
		e.past.known.Store(!failing)
		if failing {
			return min(interval, 100*time.Millisecond) // soon: a process knows no history until then
		}
		return interval
	}
	e.past.following.Store(true)
	next := round()
	go func() {
		for {
			t := time.NewTimer(next)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			case <-e.past.changed:
				t.Stop()
			}
			next = round()
		}
	}()
}

func (e *Engine) followLimitsOnce(ctx context.Context, h LimitHistory, now time.Time) error {
	rs := e.set.Load()
	set := e.keyOverrides.current()
	e.past.noteSet(set, rs) // the overrides that left, even before a request meets them
	own := map[string][]sluice.Limit{}
	add := func(rule string, l sluice.Limit) {
		if !slices.Contains(own[rule], l) {
			own[rule] = append(own[rule], l)
		}
	}
	for _, r := range rs.rules {
		add(r.ID, r.store)
	}
	for _, o := range set.Live(now) {
		if base := rs.find(o.Rule); base != nil && o.Action == overrides.Limit {
			add(o.Rule, overrideLimit(base, o))
		}
	}
	noted := maps.Clone(own) // and the limits that left here, while keys may hold state under them
	if v := e.past.view.Load(); v != nil {
		for rule, rp := range *v {
			for _, ls := range append([][]pastLimit{rp.all}, slices.Collect(maps.Values(rp.exact))...) {
				for _, l := range ls {
					if l.until.After(now) && !slices.Contains(noted[rule], l.limit) {
						noted[rule] = append(noted[rule], l.limit)
					}
				}
			}
			for _, ls := range rp.prefixes {
				for _, l := range ls {
					if l.until.After(now) && !slices.Contains(noted[rule], l.limit) {
						noted[rule] = append(noted[rule], l.limit)
					}
				}
			}
		}
	}
	noteErr := h.Note(ctx, noted, now)
	recent, err := h.Recent(ctx)
	if err != nil {
		return err
	}
	shared := pastView{}
	for rule, ls := range recent {
		if rs.find(rule) == nil {
			continue
		}
		var past []pastLimit
		for l, at := range ls {
			if until := at.Add(horizon(l)); !slices.Contains(own[rule], l) && until.After(now) {
				past = append(past, pastLimit{l, until})
			}
		}
		slices.SortFunc(past, func(a, b pastLimit) int { return b.until.Compare(a.until) })
		if len(past) > maxPastLimits {
			past = past[:maxPastLimits]
		}
		if len(past) > 0 {
			shared[rule] = &rulePast{all: past}
		}
	}
	if len(shared) == 0 {
		e.past.shared.Store(nil)
	} else {
		e.past.shared.Store(&shared)
	}
	return noteErr
}

// LimitsKnown reports whether a process following the limits the others
// count under (FollowLimits) has read them in its last round; true for one
// that does not follow them. Until then a key whose limit changed
// elsewhere may start afresh here: /readyz says not ready.
func (e *Engine) LimitsKnown() bool { return !e.past.following.Load() || e.past.known.Load() }

// LimitsChanged tells FollowLimits that the overrides in force changed:
// the limits this process counts under are noted at once. (A reload does
// so itself.)
func (e *Engine) LimitsChanged() { e.past.wake() }

func (p *pastLimits) wake() {
	select {
	case p.changed <- struct{}{}:
	default:
	}
}
