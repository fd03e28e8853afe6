package engine

import (
	"context"
	"fmt"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/storecall"
)

// countOn rules: checked with a dry run before the handler, charged after
// it only when the response's status is listed.

// Charge completes a check after the response: it charges the countOn rules
// whose status list holds status. Call it once per allowed request.
func (e *Engine) Charge(ctx context.Context, res *Result, status int) {
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if st.charge == 0 || !counts(st.r.CountOn, status) {
			continue
		}
		e.charge(ctx, res, st.r, sluice.Take{Rule: st.r.ID, Key: st.key, Limit: st.r.Limit, Cost: st.charge})
		st.charge = 0
	}
}

// charge makes one countOn charge. What it counts has happened (a failed
// login was served), so it is charged whatever the limit says
// (sluice.Take.Charge), as an Envoy usage report is: on a full count, or
// above the burst, the key goes into debt and later checks wait it out. It
// is taken by the store, and mirrored into the share; or, when the store
// did not take it in time, counted in this gateway's share and owed to the
// store: a late reply that took it cancels the debt (see late.go). It
// reports the decision and whether the store failed.
func (e *Engine) charge(ctx context.Context, res *Result, r *rule, tk sluice.Take) (sluice.Decision, error) {
	r.stats.charged.Add(1)
	tk.Charge = true
	takes := [1]sluice.Take{tk}
	var out [1]sluice.Decision
	err := e.client.Take(ctx, storecall.Call{Owing: true, Wait: r.SlowStoreWait}, takes[:], out[:])
	if err == nil {
		e.follow(ctx, res, r, r.Limit, &takes[0], &out[0]) // the share knows what the store has left
		return out[0], nil
	}
	return e.fallbackTake(ctx, r, r.Limit, tk), err
}

func counts(statuses []int, status int) bool {
	for _, s := range statuses {
		if s == status {
			return true
		}
	}
	return false
}

// ChargeStatus charges the countOn rules that req matches and whose status
// list holds status, as Charge does after a check: for callers that check
// before a response and report its status in a second call (the service's
// /v1/charge). It fills res with the charged rules' decisions.
func (e *Engine) ChargeStatus(ctx context.Context, req *rules.Request, opt CheckOptions, status int, res *Result) error {
	if opt.Cost < 0 {
		return fmt.Errorf("engine: cost must be >= 0, got %d", opt.Cost)
	}
	mult := max(opt.Cost, 1)
	rs := e.set.Load()
	res.reset(rs)
	if !e.match(rs, req, res, func(r *rule) bool {
		return len(r.CountOn) > 0 && !r.Shadow && r.Envoy == nil && counts(r.CountOn, status)
	}, true) {
		return nil // refused when it was checked: nothing to charge
	}
	res.takes = res.takes[:0]
	for i := range res.matched {
		m := &res.matched[i]
		res.takes = append(res.takes, sluice.Take{Rule: m.r.ID, Key: m.key, Limit: m.r.Limit, Cost: mulCost(m.r.Cost, mult), Was: m.wasOf(m.r.Limit)})
	}
	if len(res.takes) == 0 {
		return nil
	}
	// Each charge stands alone: a failed attempt counts even if another
	// rule's count is already full.
	for i := range res.takes {
		m := &res.matched[i]
		d, err := e.charge(ctx, res, m.r, res.takes[i])
		st := res.add(m.r, m.key, d)
		if err != nil {
			res.StoreError, st.FailedOpen = err, true
		}
	}
	return nil
}
