package httplimit

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
)

// Problem types registered by the RateLimit header draft.
const (
	ProblemQuotaExceeded    = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	ProblemAbnormalUsage    = "https://iana.org/assignments/http-problem-types#abnormal-usage-detected"
	ProblemReducedCapacity  = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
	problemContentType      = "application/problem+json"
	titleQuotaExceeded      = "Quota Exceeded"
	titleAbnormalUsage      = "Abnormal Usage Detected"
	titleReducedCapacity    = "Temporary Reduced Capacity"
	detailNeverAdmissible   = "This request costs more than the limit allows at once; it can never pass."
	detailReducedCapacityFn = "The service cannot count requests for this limit right now. Try again in about %s."
)

// Problem is an RFC 9457 problem details object, with the RateLimit draft's
// violated-policies extension.
type Problem struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail"`
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
	// Field names the request's field at fault, for a bad request.
	Field string `json:"field,omitempty"`
}

// ProblemFor describes a rejection. It names the rules that rejected the
// request and nothing else: no store error, no key, no other rule.
func ProblemFor(res *engine.Result) *Problem {
	p := new(Problem)
	FillProblem(p, res)
	return p
}

// FillProblem is ProblemFor into p, reusing its ViolatedPolicies' room: for
// servers that answer many rejections and keep a Problem per worker.
func FillProblem(p *Problem, res *engine.Result) {
	d := &res.Decision
	*p = Problem{Type: ProblemQuotaExceeded, Title: titleQuotaExceeded, Status: http.StatusTooManyRequests, ViolatedPolicies: p.ViolatedPolicies[:0]}
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if !st.Shadow && !st.Allowed && !contains(p.ViolatedPolicies, st.Rule) {
			p.ViolatedPolicies = append(p.ViolatedPolicies, st.Rule)
		}
	}
	switch d.Reason {
	case sluice.ReasonLocked:
		p.Type, p.Title = ProblemAbnormalUsage, titleAbnormalUsage
		p.Detail = fmt.Sprintf("Too many rejected requests: access is suspended. Try again in about %s.", about(d.RetryAfter))
	case sluice.ReasonUnavailable:
		p.Type, p.Title, p.Status = ProblemReducedCapacity, titleReducedCapacity, http.StatusServiceUnavailable
		p.Detail = fmt.Sprintf(detailReducedCapacityFn, about(d.RetryAfter))
	case sluice.ReasonMissingKey:
		p.Type, p.Title, p.Status = "about:blank", "Bad Request", http.StatusBadRequest
		p.Detail = fmt.Sprintf("This request lacks what the %q limit counts by.", d.Rule)
	case sluice.ReasonBadRequest:
		p.Type, p.Title, p.Status = "about:blank", "Bad Request", http.StatusBadRequest
		switch res.InvalidStatus {
		case http.StatusRequestEntityTooLarge:
			p.Title, p.Status = "Content Too Large", res.InvalidStatus
		case http.StatusUnsupportedMediaType:
			p.Title, p.Status = "Unsupported Media Type", res.InvalidStatus
		}
		p.Detail = "This request cannot be counted as the service would read it: " + res.Invalid + "."
	case sluice.ReasonTooLarge:
		p.Detail = detailNeverAdmissible
	case sluice.ReasonLimited:
		if res.Reduced { // only the service's pressure refused it
			p.Type, p.Title, p.Status = ProblemReducedCapacity, titleReducedCapacity, http.StatusServiceUnavailable
			p.Detail = "The service is under load: the limit is " + limitWords(d.Limit, unitsOf(res)) + " for now. Try again in about " + about(d.RetryAfter) + "."
			break
		}
		fallthrough
	default:
		p.Detail = "Limit is " + limitWords(d.Limit, unitsOf(res)) + ". Try again in about " + about(d.RetryAfter) + "."
	}
	if p.Status == http.StatusTooManyRequests {
		p.Status = refusalStatus(res) // the rule's own refusals: limited, too large, locked
	}
	if len(p.ViolatedPolicies) == 0 {
		p.ViolatedPolicies = nil // omitted, as a fresh Problem's
	}
}

// refusalStatus is the status the deciding rule refuses with: 429, or 503
// when the rule says so (status: 503, as nginx's limit_req answers).
func refusalStatus(res *engine.Result) int {
	for i := range res.Statuses {
		if st := &res.Statuses[i]; st.Rule == res.Decision.Rule {
			if r := st.RuleDef(); r != nil && r.RefusalStatus != 0 {
				return r.RefusalStatus
			}
			break
		}
	}
	return http.StatusTooManyRequests
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// unitsOf is what the deciding rule counts ("requests", "tokens").
func unitsOf(res *engine.Result) string {
	for i := range res.Statuses {
		if st := &res.Statuses[i]; st.Rule == res.Decision.Rule {
			if r := st.RuleDef(); r != nil {
				return r.Units()
			}
		}
	}
	return "requests"
}

// limitWords writes a limit as "100 requests per minute" (units names what
// is counted, in the plural). The words of a limit never change, and every
// rejection writes them: they are kept, for a bounded number of limits
// (rules and Envoy overrides are bounded too).
func limitWords(l sluice.Limit, units string) string {
	k := wordsKey{l, units}
	if w, ok := wordsOf.Load(k); ok {
		return w.(string)
	}
	if l.Rate == 1 && strings.HasSuffix(units, "s") {
		units = units[:len(units)-1]
	}
	w := strconv.FormatInt(l.Rate, 10) + " " + units + " per " + periodWords(l.Period)
	if wordsKept.Add(1) <= maxWordsKept {
		wordsOf.Store(k, w)
	}
	return w
}

type wordsKey struct {
	l     sluice.Limit
	units string
}

var (
	wordsOf   sync.Map // wordsKey -> string
	wordsKept atomic.Int64
)

const maxWordsKept = 4096

func periodWords(d time.Duration) string {
	for _, u := range []struct {
		d    time.Duration
		name string
	}{{24 * time.Hour, "day"}, {time.Hour, "hour"}, {time.Minute, "minute"}, {time.Second, "second"}} {
		if d%u.d == 0 {
			if n := d / u.d; n != 1 {
				return fmt.Sprintf("%d %ss", n, u.name)
			}
			return u.name
		}
	}
	return d.String()
}

// about writes a wait in round words: "20 seconds", "3 minutes".
func about(d time.Duration) string {
	s := seconds(d, 1)
	switch {
	case s == 1:
		return "1 second"
	case s < 120:
		return strconv.FormatInt(s, 10) + " seconds"
	case s < 2*3600:
		return strconv.FormatInt((s+59)/60, 10) + " minutes"
	}
	return strconv.FormatInt((s+3599)/3600, 10) + " hours"
}
