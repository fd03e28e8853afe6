package httplimit

import (
	"fmt"
	"net/http"
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

// VisitHeaders hands out exactly the fields Headers writes, refused or
// allowed, with the legacy fields or without.
func TestVisitHeadersMatchesHeaders(t *testing.T) {
	l := sluice.Limit{Rate: 5, Period: time.Minute}
	result := func(allowed bool, remaining int64, rules ...string) *engine.Result {
		res := &engine.Result{Allowed: allowed}
		for _, r := range rules {
			res.Statuses = append(res.Statuses, engine.Status{Decision: sluice.Decision{Rule: r, Limit: l, Allowed: allowed, Remaining: remaining, ResetAfter: 30 * time.Second}})
		}
		res.Decision = res.Statuses[0].Decision
		if !allowed {
			res.Decision.RetryAfter = 12 * time.Second
		}
		return res
	}
	for _, legacy := range []bool{false, true} {
		lim := New(nil, Options{LegacyHeaders: legacy, AllowedHeaders: HeadersAlways})
		for i, res := range []*engine.Result{result(false, 0, "a", "b"), result(true, 3, "a"), result(false, 0, "c")} {
			want := http.Header{}
			lim.Headers(want, res)
			got := http.Header{}
			lim.VisitHeaders(res, func(name string, v []byte) { got[name] = append(got[name], string(v)) })
			if !reflect.DeepEqual(got, want) || len(want) < 2 {
				t.Fatalf("legacy %v, result %d: visited %v, Headers wrote %v", legacy, i, got, want)
			}
		}
	}
}

// The words of at most maxWordsKept limits are kept, however many limits
// (Envoy overrides come from clients) are refused.
func TestLimitWordsKeptAreBounded(t *testing.T) {
	for i := range 2*maxWordsKept + 10 {
		l := sluice.Limit{Rate: int64(1_000_000 + i), Period: time.Hour}
		if got, want := limitWords(l, "requests"), fmt.Sprintf("%d requests per hour", 1_000_000+i); got != want {
			t.Fatalf("limitWords = %q, want %q", got, want)
		}
	}
	kept := 0
	wordsOf.Range(func(any, any) bool { kept++; return true })
	if kept > maxWordsKept {
		t.Fatalf("%d limits' words kept, want at most %d", kept, maxWordsKept)
	}
}

// violated-policies names each refusing rule once, in order; rules that
// admitted and shadow rules are not named.
func TestViolatedPoliciesNameEachRefusingRuleOnce(t *testing.T) {
	st := func(rule string, allowed, shadow bool) engine.Status {
		return engine.Status{Decision: sluice.Decision{Rule: rule, Allowed: allowed}, Shadow: shadow}
	}
	res := &engine.Result{Decision: sluice.Decision{Reason: sluice.ReasonLimited, RetryAfter: time.Second},
		Statuses: []engine.Status{st("a", false, false), st("b", true, false), st("c", false, false), st("a", false, false), st("d", false, true)}}
	var p Problem
	FillProblem(&p, res)
	if !reflect.DeepEqual(p.ViolatedPolicies, []string{"a", "c"}) {
		t.Fatalf("violated-policies %q, want [a c]", p.ViolatedPolicies)
	}
}
