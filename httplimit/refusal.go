package httplimit

import (
	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
)

// A refusal's fields (VisitHeaders) and problem (FillProblem) are a
// function of a few of its result's fields: each status's rule, limit,
// cost, outcome and shadowing, and the deciding decision's rule, limit,
// reason, remaining units, whole seconds to wait, whole seconds to reset
// (with the legacy fields) and reduced flag. Nothing else of the result is
// read: not the time, not the key, not the other statuses' remaining units.
// A flood of refused requests mostly repeats one refusal, so a server can
// keep the refusal it rendered last with its RefusalKey, and write it again
// while the key stays the same. TestRefusalKeyDecidesTheRendering checks
// the claim: results with equal keys render the same, on random results.
//
// Keep this list in step with visitRejectFields, visitFields and
// FillProblem: a field they come to read must join the key.

// maxKeyStatuses bounds the statuses a key holds; results with more are
// rendered afresh.
const maxKeyStatuses = 4

// RefusalKey is what the rendering of a refused result depends on. Keys
// are comparable with ==.
type RefusalKey struct {
	n         int
	statuses  [maxKeyStatuses]keyStatus
	rule      string
	limit     sluice.Limit
	reason    sluice.Reason
	reduced   bool
	remaining int64
	retry     int64 // whole seconds in Retry-After, 0 when there is none
	reset     int64 // whole seconds to reset, for the legacy fields
	status    int   // the deciding rule's refusal status (a reload may change it)
}

type keyStatus struct {
	rule            string
	limit           sluice.Limit
	cost            int64
	allowed, shadow bool
}

// RefusalKey writes res's key to k and reports whether res has one: not
// with Options.Jitter (each refusal waits its own time), not for an
// allowed result, and not for more than four statuses.
func (l *Limiter) RefusalKey(res *engine.Result, k *RefusalKey) bool {
	if res.Allowed || l.o.Jitter > 0 || len(res.Statuses) > maxKeyStatuses || res.Reason == sluice.ReasonBadRequest {
		return false // a bad request's detail says why: rendered afresh
	}
	d := &res.Decision
	*k = RefusalKey{
		n: len(res.Statuses), rule: d.Rule, limit: d.Limit, reason: d.Reason, reduced: res.Reduced,
		remaining: d.Remaining, status: refusalStatus(res),
	}
	if d.RetryAfter > 0 {
		k.retry = seconds(d.RetryAfter, 1)
	}
	if l.o.LegacyHeaders {
		k.reset = seconds(d.ResetAfter, 0)
	}
	for i := range res.Statuses {
		st := &res.Statuses[i]
		k.statuses[i] = keyStatus{rule: st.Rule, limit: st.Limit, cost: costOf(st), allowed: st.Allowed, shadow: st.Shadow}
	}
	return true
}

// A Refusal is a refused result rendered for the wire, kept to be written
// again: its status, fields and problem body. Render renders a result
// afresh only when its RefusalKey differs from the one rendered last, so a
// flood of refusals that repeat one another costs one rendering. Keep one
// per worker or connection: it is not safe for concurrent use, and its
// buffers are reused from one rendering to the next.
type Refusal struct {
	keyed   bool
	key     RefusalKey
	status  int
	fields  []renderedField
	vals    []byte
	body    []byte
	problem Problem
}

type renderedField struct {
	name       string
	start, end int // its value in vals
}

// Render makes r the rendering of res by l: the fields of VisitHeaders and
// the problem of FillProblem.
func (r *Refusal) Render(l *Limiter, res *engine.Result) {
	var k RefusalKey
	keyed := l.RefusalKey(res, &k)
	if keyed && r.keyed && k == r.key {
		return
	}
	r.keyed, r.key = keyed, k
	r.fields, r.vals = r.fields[:0], r.vals[:0]
	l.VisitHeaders(res, func(name string, v []byte) {
		r.fields = append(r.fields, renderedField{name: name, start: len(r.vals), end: len(r.vals) + len(v)})
		r.vals = append(r.vals, v...)
	})
	FillProblem(&r.problem, res)
	r.body = AppendProblem(r.body[:0], &r.problem)
	r.status = r.problem.Status
}

// Status is the refusal's status: 429, or a rule's own.
func (r *Refusal) Status() int { return r.status }

// Fields is the number of the refusal's fields.
func (r *Refusal) Fields() int { return len(r.fields) }

// Field returns the refusal's i-th field. The value is r's: valid until
// the next Render.
func (r *Refusal) Field(i int) (name string, value []byte) {
	f := &r.fields[i]
	return f.name, r.vals[f.start:f.end]
}

// Body is the refusal's problem+json body, r's until the next Render.
func (r *Refusal) Body() []byte { return r.body }
