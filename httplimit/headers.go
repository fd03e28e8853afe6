package httplimit

import (
	"math/bits"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
)

// Header names, in Go's canonical form so that Header.Get finds them (field
// names are case-insensitive on the wire).
const (
	headerPolicy     = "Ratelimit-Policy"
	headerRateLimit  = "Ratelimit"
	headerRetryAfter = "Retry-After"
	legacyLimit      = "X-Ratelimit-Limit"
	legacyRemaining  = "X-Ratelimit-Remaining"
	legacyReset      = "X-Ratelimit-Reset"
)

// maxSFInteger is the largest structured-field integer (15 digits).
const maxSFInteger = 999_999_999_999_999

// seconds rounds d up to whole seconds, at least min.
func seconds(d time.Duration, min int64) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return clamp(max(s, min))
}

func clamp(n int64) int64 { return max(0, min(n, maxSFInteger)) }

// quota returns what a policy advertises for limit l when a request costs
// cost units: q, the requests the limit admits at once from full (its
// capacity: the burst for the bucket family, the rate for the windows,
// divided by the cost), and w, the time in which it gives all of them back
// (the bucket's refill time, the window's length). q is then the same quota
// that remaining counts down: 5 at once then 1 per second is q=5;w=5, not
// q=1;w=1 with 4 remaining. The unit is requests, the draft's default, so a
// rule whose requests cost 50 units advertises capacity/50.
func quota(l sluice.Limit, cost int64) (q int64, w time.Duration) {
	cost = max(cost, 1)
	if !l.Algorithm.IsBucket() {
		return l.Rate / cost, l.Period
	}
	// c * Period / Rate exactly (c*T would round each of the c intervals
	// up, and 7 per minute would read w=61): the quotient fits, being at
	// most Burst*T, which Limit.Validate bounds.
	c := l.Capacity()
	hi, lo := bits.Mul64(uint64(c), uint64(l.Period))
	if hi >= uint64(l.Rate) { // not a validated limit
		return c / cost, l.Period
	}
	d, _ := bits.Div64(hi, lo, uint64(l.Rate))
	return c / cost, time.Duration(d)
}

// appendPolicy appends one RateLimit-Policy member, "id";q=<q>;w=<w in
// seconds> (see quota).
func appendPolicy(b []byte, rule string, l sluice.Limit, cost int64) []byte {
	q, w := quota(l, cost)
	b = appendName(b, rule)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, clamp(q), 10)
	b = append(b, ";w="...)
	return strconv.AppendInt(b, seconds(w, 1), 10)
}

// costOf returns the units one request takes under st's rule (its cost,
// 1 unless the rule sets one).
func costOf(st *engine.Status) int64 {
	if r := st.RuleDef(); r != nil && r.Cost > 1 {
		return r.Cost
	}
	return 1
}

// appendName appends a rule id as an sf-String. Ids are validated to
// [A-Za-z0-9._-], which needs no escaping.
func appendName(b []byte, rule string) []byte {
	b = append(b, '"')
	b = append(b, rule...)
	return append(b, '"')
}

// policyCache remembers the last RateLimit-Policy value: policies are stable
// across responses, so most requests reuse it instead of allocating a string.
type policyCache struct{ last atomic.Pointer[string] }

func (c *policyCache) value(b []byte) string {
	if p := c.last.Load(); p != nil && *p == string(b) {
		return *p
	}
	v := string(b)
	c.last.Store(&v)
	return v
}

// setHeaders writes the RateLimit fields (and the legacy ones, if asked) for
// a result into h (see visitFields).
func setHeaders(h http.Header, res *engine.Result, legacy bool, t int64, buf []byte, cache *policyCache) []byte {
	return visitFields(func(name string, v []byte) { h[name] = []string{fieldString(name, v, cache)} }, res, legacy, t, buf)
}

// fieldString copies a field's value out of the buffer it was written in;
// the policy, which rarely changes, from the cache.
func fieldString(name string, v []byte, cache *policyCache) string {
	if name == headerPolicy {
		return cache.value(v)
	}
	return string(v)
}

// visitFields calls set with each RateLimit field (and the legacy ones, if
// asked) for a result, in a fixed order. t, in whole seconds, is given only
// when the client has to wait. The values are written in buf, reused from
// field to field: set must copy what it keeps. It returns buf, grown.
func visitFields(set func(name string, value []byte), res *engine.Result, legacy bool, t int64, buf []byte) []byte {
	buf = buf[:0]
	seen := 0
	for i := range res.Statuses {
		st := &res.Statuses[i]
		if st.Shadow || st.Limit.Rate == 0 || duplicateRule(res.Statuses[:i], st.Rule) {
			continue
		}
		if seen > 0 {
			buf = append(buf, ", "...)
		}
		buf = appendPolicy(buf, st.Rule, st.Limit, costOf(st))
		seen++
	}
	if seen == 0 {
		return buf
	}
	set(headerPolicy, buf)
	d := &res.Decision
	cost := int64(1)
	for i := range res.Statuses {
		if st := &res.Statuses[i]; st.Rule == d.Rule && !st.Shadow {
			cost = costOf(st)
			break
		}
	}
	remaining := clamp(d.Remaining) / cost // in requests, as q is
	buf = buf[:0]
	buf = appendName(buf, d.Rule)
	buf = append(buf, ";r="...)
	buf = strconv.AppendInt(buf, remaining, 10)
	if t > 0 {
		buf = append(buf, ";t="...)
		buf = strconv.AppendInt(buf, t, 10)
	}
	set(headerRateLimit, buf)
	if legacy {
		q, _ := quota(d.Limit, cost)
		set(legacyLimit, strconv.AppendInt(buf[:0], clamp(q), 10))
		set(legacyRemaining, strconv.AppendInt(buf[:0], remaining, 10))
		set(legacyReset, strconv.AppendInt(buf[:0], seconds(d.ResetAfter, 0), 10))
	}
	return buf
}

func duplicateRule(before []engine.Status, rule string) bool {
	for i := range before {
		if before[i].Rule == rule && !before[i].Shadow {
			return true
		}
	}
	return false
}

// DisplayName spells a canonical header name as the RateLimit draft does
// (RateLimit, RateLimit-Policy), for answers that carry header names as
// data: the JSON API's headers and Envoy's headers to add.
func DisplayName(canonical string) string {
	switch canonical {
	case "Ratelimit":
		return "RateLimit"
	case "Ratelimit-Policy":
		return "RateLimit-Policy"
	}
	if !strings.Contains(canonical, "Ratelimit") {
		return canonical
	}
	return rateLimitSpelling.Replace(canonical)
}

var rateLimitSpelling = strings.NewReplacer("Ratelimit", "RateLimit")
