package client

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// pacer spaces one server's requests by what its answers say of the quota
// (see learn). With the quota's policy known (RateLimit-Policy: q requests
// per w seconds), it keeps a token bucket of its own like the server's:
// q tokens at most, one back every w/q; a request takes a token, or waits
// for the next one. It refills only by its own clock, and an answer can
// only lower it, to what the server said is left less what the requests
// still in flight will take: so a token the server refills is spent once,
// by a paced request, never also by a stale count. Without a policy (the
// legacy fields), it sends while the server's count says there is room,
// and after a refusal none before the reset. A client sending as fast as
// it can therefore sends at the rate the server refills: it uses the quota
// and is seldom refused.
type pacer struct {
	mu       sync.Mutex
	inflight int64 // requests started and not answered: they will spend quota too

	// With a policy:
	every  time.Duration // one token back every (0: no policy known)
	size   float64       // at most this many tokens (q)
	tokens float64       // may be negative: the waits already promised
	last   time.Time     // when tokens was refilled

	// Without one:
	credit int64     // requests the server said may pass, less those started since
	known  bool      // credit was read from an answer
	until  time.Time // no request before (a refusal's reset)

	// Until a first answer has been read, one request goes alone and the
	// others wait for it (at most probeWait): a client that starts many
	// requests at once learns the quota before it floods.
	learned chan struct{} // closed by the first answer
}

const probeWait = time.Second

// reserve returns how long a request starting at now must wait.
func (p *pacer) reserve(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inflight++
	if p.every > 0 {
		p.refill(now)
		p.tokens--
		if p.tokens >= 0 {
			return 0
		}
		return time.Duration(-p.tokens * float64(p.every))
	}
	if now.Before(p.until) {
		return p.until.Sub(now)
	}
	if p.known {
		p.credit--
	}
	return 0
}

func (p *pacer) refill(now time.Time) {
	if now.After(p.last) {
		p.tokens = min(p.size, p.tokens+float64(now.Sub(p.last))/float64(p.every))
		p.last = now
	}
}

// quota is what an answer says of the quota.
type quota struct {
	remaining       int64
	hasRemaining    bool
	reset           time.Duration // until more is available (with remaining 0)
	quotaN, windowS int64         // RateLimit-Policy's q and w, or 0
}

func (p *pacer) learn(now time.Time, q quota, found, refused bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	first := p.markLearned()
	p.inflight = max(p.inflight-1, 0)
	if !found {
		return
	}
	if q.quotaN > 0 && q.windowS > 0 {
		every := time.Duration(q.windowS) * time.Second / time.Duration(q.quotaN)
		if p.every == 0 || first {
			p.tokens, p.last = float64(q.quotaN), now
		}
		p.every, p.size = every, float64(q.quotaN)
	}
	if !q.hasRemaining {
		return
	}
	// What the server said is left, less what the requests still in flight
	// will take of it.
	left := q.remaining - p.inflight
	if p.every > 0 {
		// The bucket follows the server's only at the start and on a
		// refusal (the server's clock ran ahead of ours: a slot was early);
		// otherwise the counts in answers are older than the requests
		// already promised slots, and lowering by them would waste quota.
		p.refill(now)
		switch {
		case first:
			p.tokens = min(p.tokens, float64(left))
		case q.remaining == 0 && refused:
			p.tokens, p.last = min(p.tokens, 0), now
		}
		return
	}
	p.credit, p.known = max(left, 0), true
	if q.remaining == 0 && q.reset > 0 {
		p.until = now.Add(q.reset)
	}
}

// markLearned ends the probe and reports whether this was the first
// answer. Call with p.mu held.
func (p *pacer) markLearned() bool {
	if p.learned != nil {
		select {
		case <-p.learned:
		default:
			close(p.learned)
			return true
		}
	}
	return false
}

// awaitProbe lets the first request go and holds the others until an
// answer has been read (or probeWait has passed).
func (p *pacer) awaitProbe(ctx context.Context) error {
	p.mu.Lock()
	if p.learned == nil {
		p.learned = make(chan struct{})
		p.mu.Unlock()
		return nil // the probe
	}
	ch := p.learned
	p.mu.Unlock()
	timer := time.NewTimer(probeWait)
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

func (t *Transport) pacerFor(req *http.Request) *pacer {
	t.mu.Lock()
	defer t.mu.Unlock()
	host := req.URL.Host
	p := t.pacers[host]
	if p == nil {
		if len(t.pacers) >= maxPacers {
			clear(t.pacers) // bounded: forgetting a pace only makes it learn again
		}
		p = &pacer{}
		t.pacers[host] = p
	}
	return p
}

// ErrBeyondDeadline is returned, unsent, for a request whose turn (the pace
// learnt from the server's RateLimit fields) comes after its context's
// deadline: it could only wait and fail. It is a context.DeadlineExceeded.
var ErrBeyondDeadline = fmt.Errorf("client: the quota the server announced comes back after this request's deadline: not sent (%w)", context.DeadlineExceeded)

// pace waits for the request's turn, within the deadline.
func (t *Transport) pace(ctx context.Context, req *http.Request, deadline time.Time) error {
	p := t.pacerFor(req)
	if err := p.awaitProbe(ctx); err != nil {
		return err
	}
	now := time.Now()
	d := p.reserve(now)
	if d <= 0 {
		return nil
	}
	if dl, ok := ctx.Deadline(); ok && now.Add(d).After(dl) {
		p.mu.Lock()
		p.inflight = max(p.inflight-1, 0) // it will not be sent
		p.mu.Unlock()
		return ErrBeyondDeadline
	}
	if now.Add(d).After(deadline) {
		d = max(deadline.Sub(now), 0) // go at the deadline and let the server answer
	}
	if t.OnPace != nil {
		t.OnPace(req, d)
	}
	if err := sleep(ctx, d); err != nil {
		p.mu.Lock()
		p.inflight = max(p.inflight-1, 0) // it will not be sent
		p.mu.Unlock()
		return err
	}
	return nil
}

// learn reads what an answer says of the quota: the RateLimit fields of the
// IETF draft (RateLimit: "p";r=R;t=T, RateLimit-Policy: "p";q=Q;w=W, the
// policy being the one RateLimit names) or the legacy X-RateLimit-Remaining
// and X-RateLimit-Reset (seconds, or a Unix time as GitHub sends it).
func (t *Transport) learn(req *http.Request, resp *http.Response) {
	q, ok := parseQuota(resp.Header, time.Now())
	if ok && resp.StatusCode == http.StatusTooManyRequests && q.hasRemaining && q.remaining == 0 && q.reset == 0 {
		if d, ok := RetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			q.reset = d
		}
	}
	t.pacerFor(req).learn(time.Now(), q, ok, resp.StatusCode == http.StatusTooManyRequests)
}

func parseQuota(h http.Header, now time.Time) (quota, bool) {
	var q quota
	found := false
	if v := h.Get("RateLimit"); v != "" {
		name, params := firstMember(v)
		if r, ok := params["r"]; ok {
			q.remaining, q.hasRemaining, found = r, true, true
		}
		if tt, ok := params["t"]; ok {
			q.reset = time.Duration(tt) * time.Second
		}
		for _, m := range members(h.Get("RateLimit-Policy")) {
			n, ps := firstMember(m)
			if n == name || name == "" {
				q.quotaN, q.windowS = ps["q"], ps["w"]
				break
			}
		}
	}
	if !found {
		if r, err := strconv.ParseInt(h.Get("X-RateLimit-Remaining"), 10, 64); err == nil {
			q.remaining, q.hasRemaining, found = r, true, true
			if s, err := strconv.ParseInt(h.Get("X-RateLimit-Reset"), 10, 64); err == nil {
				if s > 1_000_000_000 { // a Unix time
					q.reset = max(time.Unix(s, 0).Sub(now), 0)
				} else {
					q.reset = time.Duration(s) * time.Second
				}
			}
		}
	}
	return q, found
}

// members splits a structured-field list on its top-level commas (names
// are quoted strings: a comma inside quotes does not split).
func members(v string) []string {
	var out []string
	inQuote, start := false, 0
	for i := 0; i < len(v); i++ {
		switch v[i] {
		case '"':
			inQuote = !inQuote
		case ',':
			if !inQuote {
				out = append(out, strings.TrimSpace(v[start:i]))
				start = i + 1
			}
		}
	}
	if s := strings.TrimSpace(v[start:]); s != "" {
		out = append(out, s)
	}
	return out
}

// firstMember returns a member's name (its quoted string, or token) and
// its integer parameters.
func firstMember(m string) (string, map[string]int64) {
	if ms := members(m); len(ms) > 0 {
		m = ms[0]
	}
	parts := strings.Split(m, ";")
	params := map[string]int64{}
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			params[k] = n
		}
	}
	return strings.Trim(strings.TrimSpace(parts[0]), `"`), params
}
