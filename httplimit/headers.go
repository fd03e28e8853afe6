package httplimit

import (
	"net/http"
	"strconv"
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

// appendPolicy appends one RateLimit-Policy member: the rule as its author
// wrote it, "id";q=<rate>;w=<period in seconds>.
func appendPolicy(b []byte, rule string, l sluice.Limit) []byte {
	b = appendName(b, rule)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, clamp(l.Rate), 10)
	b = append(b, ";w="...)
	return strconv.AppendInt(b, seconds(l.Period, 1), 10)
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
// a result. t, in whole seconds, is given only when the client has to wait.
func setHeaders(h http.Header, res *engine.Result, legacy bool, t int64, buf []byte, cache *policyCache) []byte {
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
		buf = appendPolicy(buf, st.Rule, st.Limit)
		seen++
	}
	if seen == 0 {
		return buf
	}
	h[headerPolicy] = []string{cache.value(buf)}
	d := &res.Decision
	buf = buf[:0]
	buf = appendName(buf, d.Rule)
	buf = append(buf, ";r="...)
	buf = strconv.AppendInt(buf, clamp(d.Remaining), 10)
	if t > 0 {
		buf = append(buf, ";t="...)
		buf = strconv.AppendInt(buf, t, 10)
	}
	h[headerRateLimit] = []string{string(buf)}
	if legacy {
		h[legacyLimit] = []string{strconv.FormatInt(clamp(d.Limit.Rate), 10)}
		h[legacyRemaining] = []string{strconv.FormatInt(clamp(d.Remaining), 10)}
		h[legacyReset] = []string{strconv.FormatInt(seconds(d.ResetAfter, 0), 10)}
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
