package httplimit

import (
	"reflect"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
)

// A Problem filled again for another rejection says exactly what a fresh
// one would: nothing of the previous rejection stays behind.
func TestFillProblemReusedIsFresh(t *testing.T) {
	l := sluice.Limit{Rate: 5, Period: time.Minute}
	refused := func(rules ...string) *engine.Result {
		res := &engine.Result{}
		for _, r := range rules {
			res.Statuses = append(res.Statuses, engine.Status{Decision: sluice.Decision{Rule: r, Limit: l, Reason: sluice.ReasonLimited}})
		}
		res.Decision = res.Statuses[0].Decision
		res.Decision.RetryAfter = 90 * time.Second
		return res
	}
	tooLarge := refused("big")
	tooLarge.Decision.Reason = sluice.ReasonTooLarge
	var p Problem
	for i, res := range []*engine.Result{refused("a", "b", "c"), refused("d"), tooLarge, refused("e", "f")} {
		FillProblem(&p, res)
		if want := ProblemFor(res); !reflect.DeepEqual(&p, want) {
			t.Fatalf("rejection %d: reused %+v, fresh %+v", i, p, *want)
		}
	}
}
