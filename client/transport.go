// Package client is the other side of a rate limit: an http.RoundTripper for
// Go programs that call rate-limited APIs. It retries what is safe to retry,
// as the server asks (Retry-After) or with exponential backoff and full
// jitter, within a retry budget, so that a fleet of clients cannot turn an
// outage into a retry storm; and it paces requests from the RateLimit fields
// the server sends (the IETF draft's RateLimit and RateLimit-Policy, or the
// legacy X-RateLimit-*), so that it uses its quota without being refused.
//
//	c := &http.Client{Transport: &client.Transport{}}
//
// A Transport has no global state; its zero value is ready to use, and one
// Transport is safe for concurrent use.
package client

import (
	"context"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// The retry settings a zero Transport field stands for.
const (
	DefaultMaxRetries = 3
	DefaultMaxElapsed = 30 * time.Second
	DefaultBaseDelay  = 100 * time.Millisecond
	DefaultMaxDelay   = 10 * time.Second
)

// Transport retries and paces requests over Base (see the package doc).
type Transport struct {
	// Base sends the requests (default http.DefaultTransport).
	Base http.RoundTripper
	// MaxRetries bounds the retries of one request (default 3; -1: none).
	MaxRetries int
	// MaxElapsed bounds the time one request may take, retries and waits
	// included (default 30 s); the request's context bounds it too. A wait
	// that would pass it is not made: the last answer is returned.
	MaxElapsed time.Duration
	// BaseDelay and MaxDelay shape the backoff without Retry-After: a wait
	// drawn uniformly from [0, min(MaxDelay, BaseDelay * 2^attempt)) ("full
	// jitter"); defaults 100 ms and 10 s. MaxDelay also caps Retry-After.
	BaseDelay, MaxDelay time.Duration
	// RetryBudget caps retries at a share of the requests, as gRPC's retry
	// throttling does: a budget of BudgetTokens (default 10) loses one
	// token per failed attempt and gains RetryRatio (default 0.1) per
	// success, and retries are made only while more than half of it is
	// left. So in a long outage at most about RetryRatio retries are made
	// per request.
	BudgetTokens float64
	RetryRatio   float64
	// NoPacing turns self-pacing off.
	NoPacing bool
	// OnRetry, if set, is called before each retry's wait; OnPace before a
	// request waits for its pace. For metrics and logs.
	OnRetry func(req *http.Request, attempt int, wait time.Duration, resp *http.Response, err error)
	OnPace  func(req *http.Request, wait time.Duration)

	once   sync.Once
	mu     sync.Mutex
	tokens float64
	pacers map[string]*pacer // by host, at most maxPacers
	rand   func() float64    // for tests; default rand.Float64
}

const maxPacers = 1024

func (t *Transport) init() {
	t.once.Do(func() {
		if t.BudgetTokens <= 0 {
			t.BudgetTokens = 10
		}
		if t.RetryRatio <= 0 {
			t.RetryRatio = 0.1
		}
		t.tokens = t.BudgetTokens
		t.pacers = map[string]*pacer{}
		if t.rand == nil {
			t.rand = rand.Float64
		}
	})
}

func (t *Transport) base() http.RoundTripper {
	if t.Base != nil {
		return t.Base
	}
	return http.DefaultTransport
}

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.init()
	maxRetries, maxDelay := t.RetryLimits()
	maxElapsed := t.MaxElapsed
	if maxElapsed <= 0 {
		maxElapsed = DefaultMaxElapsed
	}
	deadline := time.Now().Add(maxElapsed)
	ctx := req.Context()
	for attempt := 0; ; attempt++ {
		if !t.NoPacing {
			if err := t.pace(ctx, req, deadline); err != nil {
				return nil, err
			}
		}
		r := req
		if attempt > 0 {
			var err error
			if r, err = rewind(req); err != nil {
				return nil, err
			}
		}
		resp, err := t.base().RoundTrip(r)
		if !t.NoPacing {
			if resp != nil {
				t.learn(req, resp)
			} else {
				p := t.pacerFor(req)
				p.mu.Lock()
				p.markLearned() // no answer to learn from: do not hold the others
				p.inflight = max(p.inflight-1, 0)
				p.mu.Unlock()
			}
		}
		if !retryable(req, resp, err) {
			if err == nil && resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode < 500 {
				t.succeed() // a failure it may not retry refills nothing
			}
			return resp, err
		}
		wait, ok := t.retryWait(attempt, resp, maxDelay)
		if !ok || attempt >= maxRetries || maxRetries < 0 || !t.spend() || time.Now().Add(wait).After(deadline) || ctx.Err() != nil || pastDeadline(ctx, wait) {
			return resp, err
		}
		if t.OnRetry != nil {
			t.OnRetry(req, attempt+1, wait, resp, err)
		}
		if resp != nil {
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
			resp.Body.Close()
		}
		if err := sleep(ctx, wait); err != nil {
			return nil, err
		}
	}
}

// pastDeadline reports whether a wait of d would end past ctx's deadline:
// then the answer in hand is returned rather than a wait with no answer at
// its end.
func pastDeadline(ctx context.Context, d time.Duration) bool {
	dl, ok := ctx.Deadline()
	return ok && time.Now().Add(d).After(dl)
}

// retryable reports whether the answer asks for a retry that is safe to
// make. A 429 or 503 says the server did not act on the request (RFC 6585,
// RFC 9110): any request whose body can be sent again may retry. A lost
// connection, a 502 or a 504 may have been acted on: only idempotent methods
// retry then (RFC 9110, section 9.2.2).
func retryable(req *http.Request, resp *http.Response, err error) bool {
	if req.Body != nil && req.Body != http.NoBody && req.GetBody == nil {
		return false // the body is spent: it cannot be sent again
	}
	if err != nil {
		return idempotent(req) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
	}
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return true
	case http.StatusBadGateway, http.StatusGatewayTimeout:
		return idempotent(req)
	}
	return false
}

func idempotent(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return req.Header.Get("Idempotency-Key") != ""
}

// rewind returns req ready to be sent again: a fresh body from GetBody.
func rewind(req *http.Request) (*http.Request, error) {
	if req.Body == nil || req.Body == http.NoBody {
		return req, nil
	}
	body, err := req.GetBody()
	if err != nil {
		return nil, err
	}
	r := req.Clone(req.Context())
	r.Body = body
	return r, nil
}

// RetryLimits are the retries a request may make and the longest wait
// before one: MaxRetries and MaxDelay, or their defaults where they are
// zero. The gRPC client interceptors (package grpclimit) follow them too.
func (t *Transport) RetryLimits() (maxRetries int, maxDelay time.Duration) {
	maxRetries, maxDelay = t.MaxRetries, t.MaxDelay
	if maxRetries == 0 {
		maxRetries = DefaultMaxRetries
	}
	if maxDelay <= 0 {
		maxDelay = DefaultMaxDelay
	}
	return maxRetries, maxDelay
}

// retryWait is how long to wait before the next attempt: the answer's
// Retry-After (seconds or an HTTP date) capped by MaxDelay, or a backoff with
// full jitter. ok is false when the server asks for a wait beyond MaxDelay:
// then the answer is returned at once rather than waited out.
func (t *Transport) retryWait(attempt int, resp *http.Response, maxDelay time.Duration) (time.Duration, bool) {
	if resp != nil {
		if d, ok := RetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			return d, d <= maxDelay
		}
	}
	baseDelay := t.BaseDelay
	if baseDelay <= 0 {
		baseDelay = DefaultBaseDelay
	}
	ceiling := min(float64(maxDelay), float64(baseDelay)*math.Pow(2, float64(attempt)))
	t.mu.Lock()
	d := time.Duration(t.rand() * ceiling)
	t.mu.Unlock()
	return d, true
}

// RetryAfter parses a Retry-After value, delay-seconds or an HTTP date
// (RFC 9110, section 10.2.3), as a wait from now; ok is false when v is
// neither.
func RetryAfter(v string, now time.Time) (time.Duration, bool) {
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s < 0 {
			return 0, false
		}
		return time.Duration(min(s, int64(math.MaxInt64/int64(time.Second)))) * time.Second, true
	}
	if at, err := http.ParseTime(v); err == nil {
		return max(at.Sub(now), 0), true
	}
	return 0, false
}

// spend takes a token of the retry budget for a retry, if more than half is
// left; succeed gives back a share of one for a request that needed none.
func (t *Transport) spend() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.tokens <= t.BudgetTokens/2 {
		return false
	}
	t.tokens--
	return true
}

func (t *Transport) succeed() {
	t.mu.Lock()
	t.tokens = min(t.BudgetTokens, t.tokens+t.RetryRatio)
	t.mu.Unlock()
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
