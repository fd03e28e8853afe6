package client

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"120", 2 * time.Minute, true},
		{"0", 0, true},
		{"Mon, 30 Nov 2026 12:00:30 GMT", 30 * time.Second, true},
		{"Mon, 30 Nov 2026 11:00:00 GMT", 0, true}, // in the past: now
		{"-5", 0, false},
		{"soon", 0, false},
		{"", 0, false},
	} {
		if d, ok := RetryAfter(tc.v, now); d != tc.want || ok != tc.ok {
			t.Errorf("RetryAfter(%q) = %v, %v; want %v, %v", tc.v, d, ok, tc.want, tc.ok)
		}
	}
}

// counting is a server that answers from a script of statuses, then 200.
func counting(t *testing.T, statuses []int, header http.Header) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := int(n.Add(1)) - 1
		io.Copy(io.Discard, r.Body)
		if i < len(statuses) {
			for k, v := range header {
				w.Header()[k] = v
			}
			w.WriteHeader(statuses[i])
			return
		}
		w.Write([]byte("ok"))
	}))
	t.Cleanup(ts.Close)
	return ts, &n
}

// 429 and 503 are retried as the server asks, for any request whose body
// can be sent again; 502 and 504 and lost connections only for idempotent
// methods; a spent body never.
func TestRetriesWhatIsSafe(t *testing.T) {
	ra := http.Header{"Retry-After": {"0"}}
	for _, tc := range []struct {
		name     string
		statuses []int
		method   string
		body     func() (io.Reader, bool) // the body, and whether GetBody is set
		attempts int64
		final    int
	}{
		{"503 twice, GET", []int{503, 503}, "GET", nil, 3, 200},
		{"429, POST with GetBody", []int{429}, "POST", func() (io.Reader, bool) { return strings.NewReader("x"), true }, 2, 200},
		{"429, POST with a spent body", []int{429}, "POST", func() (io.Reader, bool) { return io.NopCloser(strings.NewReader("x")), false }, 1, 429},
		{"502, POST", []int{502}, "POST", func() (io.Reader, bool) { return strings.NewReader("x"), true }, 1, 502},
		{"502, PUT", []int{502}, "PUT", func() (io.Reader, bool) { return strings.NewReader("x"), true }, 2, 200},
		{"404 is an answer", []int{404}, "GET", nil, 1, 404},
		{"four 503s, three retries", []int{503, 503, 503, 503}, "GET", nil, 4, 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts, n := counting(t, tc.statuses, ra)
			var body io.Reader
			getBody := false
			if tc.body != nil {
				body, getBody = tc.body()
			}
			req, _ := http.NewRequest(tc.method, ts.URL, body)
			if !getBody {
				req.GetBody = nil
			}
			retries := 0
			tr := &Transport{OnRetry: func(*http.Request, int, time.Duration, *http.Response, error) { retries++ }}
			resp, err := (&http.Client{Transport: tr}).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if n.Load() != tc.attempts || resp.StatusCode != tc.final || retries != int(tc.attempts-1) {
				t.Fatalf("%d attempts, %d retries, final %d; want %d attempts, final %d", n.Load(), retries, resp.StatusCode, tc.attempts, tc.final)
			}
		})
	}
}

// A lost connection is retried for GET, not for POST (it may have been
// acted on).
func TestLostConnectionsRetryOnlyIdempotentMethods(t *testing.T) {
	var n atomic.Int64
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close() // the request is lost
		}
	}()
	for method, want := range map[string]int64{"GET": 4, "POST": 1} {
		n.Store(0)
		req, _ := http.NewRequest(method, "http://"+ln.Addr().String(), strings.NewReader("x"))
		tr := &Transport{BaseDelay: time.Millisecond, Base: &http.Transport{DisableKeepAlives: true}}
		if _, err := tr.RoundTrip(req); err == nil {
			t.Fatalf("%s: no error from a server that closes every connection", method)
		}
		if got := n.Load(); got != want {
			t.Errorf("%s: %d attempts, want %d", method, got, want)
		}
	}
}

// A wait the server asks for beyond MaxDelay is not waited: the answer is
// returned at once.
func TestALongRetryAfterIsReturnedNotWaited(t *testing.T) {
	ts, n := counting(t, []int{503}, http.Header{"Retry-After": {"3600"}})
	resp, err := (&http.Client{Transport: &Transport{}}).Get(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || n.Load() != 1 {
		t.Fatalf("final %d after %d attempts; want the 503 at once", resp.StatusCode, n.Load())
	}
}

// Without Retry-After, the wait is drawn from [0, min(MaxDelay, BaseDelay *
// 2^attempt)): full jitter.
func TestBackoffHasFullJitter(t *testing.T) {
	tr := &Transport{BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second}
	tr.init()
	tr.rand = func() float64 { return 0.5 }
	for attempt, want := range []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 500 * time.Millisecond, 500 * time.Millisecond} {
		if d, ok := tr.retryWait(attempt, nil, tr.MaxDelay); !ok || d != want {
			t.Errorf("attempt %d: wait %v, want %v", attempt, d, want)
		}
	}
}

// In an outage the retry budget holds retries to a share of the requests:
// 100 requests to a server that always answers 503 make at most 5 retries
// (half of the 10 tokens), not 300.
func TestRetryBudgetBoundsAStorm(t *testing.T) {
	ts, n := counting(t, make503(1000), http.Header{"Retry-After": {"0"}})
	c := &http.Client{Transport: &Transport{}}
	for range 100 {
		resp, err := c.Get(ts.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if retries := n.Load() - 100; retries > 5 || retries < 1 {
		t.Fatalf("%d retries for 100 requests in an outage, want 1 to 5", retries)
	}
}

func make503(k int) []int {
	s := make([]int, k)
	for i := range s {
		s[i] = 503
	}
	return s
}

// The quota fields are read as sluice and others send them.
func TestParseQuota(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		h    http.Header
		want quota
	}{
		{http.Header{"Ratelimit": {`"per-user";r=4`}, "Ratelimit-Policy": {`"ip";q=600;w=60, "per-user";q=5;w=5`}}, quota{remaining: 4, hasRemaining: true, quotaN: 5, windowS: 5}},
		{http.Header{"Ratelimit": {`"per-user";r=0;t=3`}, "Ratelimit-Policy": {`"per-user";q=5;w=5`}}, quota{remaining: 0, hasRemaining: true, reset: 3 * time.Second, quotaN: 5, windowS: 5}},
		{http.Header{"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"1800000030"}}, quota{hasRemaining: true, reset: 30 * time.Second}},
		{http.Header{"X-Ratelimit-Remaining": {"7"}, "X-Ratelimit-Reset": {"12"}}, quota{remaining: 7, hasRemaining: true, reset: 12 * time.Second}},
	} {
		if got, ok := parseQuota(tc.h, now); !ok || got != tc.want {
			t.Errorf("%v: %+v, want %+v", tc.h, got, tc.want)
		}
	}
	if _, ok := parseQuota(http.Header{}, now); ok {
		t.Error("a quota read from no fields")
	}
}

// Sixteen goroutines sending as fast as they can through one Transport, to
// a server limited by sluice's middleware (20 at once, then 20 a second):
// paced by the server's RateLimit fields, they use the quota and are seldom
// refused. Bounded: 2 s.
func TestPacingUsesTheQuotaWithoutRefusals(t *testing.T) {
	cfg, err := rules.Parse("r.yaml", []byte("rules:\n  - {id: per-client, key: [header:X-Client], rate: 20, per: 1s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	e, _ := engine.New(cfg, engine.Options{Store: memory.New(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	limit := httplimit.New(e, httplimit.Options{})
	ts := httptest.NewServer(limit.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })))
	defer ts.Close()
	c := &http.Client{Transport: &Transport{MaxRetries: -1}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL, nil)
				req.Header.Set("X-Client", "c1")
				resp, err := c.Do(req)
				if err != nil {
					if errors.Is(err, context.DeadlineExceeded) {
						return
					}
					t.Error(err)
					return
				}
				resp.Body.Close()
				if resp.StatusCode == 200 {
					ok.Add(1)
				} else {
					refused.Add(1)
				}
			}
		})
	}
	wg.Wait()
	quota := 20 + 20*time.Since(start).Seconds()
	sent := ok.Load() + refused.Load()
	t.Logf("%d admitted of a quota of %.0f (%.1f%%), %d refused of %d (%.2f%%)", ok.Load(), quota, 100*float64(ok.Load())/quota, refused.Load(), sent, 100*float64(refused.Load())/float64(sent))
	if float64(ok.Load()) < 0.9*quota || float64(refused.Load()) > 0.02*float64(sent) {
		t.Fatalf("%d admitted of a quota of %.0f, %d refused of %d", ok.Load(), quota, refused.Load(), sent)
	}
}

// A failure that may not be retried (a POST refused 502) does not refill
// the retry budget: after an outage of such answers, GETs still find it
// spent.
func TestUnretriedFailuresDoNotRefillTheBudget(t *testing.T) {
	ts, n := counting(t, make503(1000), http.Header{"Retry-After": {"0"}})
	tr := &Transport{}
	c := &http.Client{Transport: tr}
	for range 20 { // GETs in the outage: the budget is spent
		resp, _ := c.Get(ts.URL)
		resp.Body.Close()
	}
	spent := n.Load()
	bad, _ := counting(t, []int{502, 502, 502, 502, 502, 502, 502, 502, 502, 502}, nil)
	for range 10 { // 502s to POSTs: not retried, and no refill
		resp, _ := c.Post(bad.URL, "text/plain", strings.NewReader("x"))
		resp.Body.Close()
	}
	resp, _ := c.Get(ts.URL)
	resp.Body.Close()
	if got := n.Load() - spent; got != 1 {
		t.Fatalf("a GET after the outage made %d attempts, want 1: the budget was refilled by failures", got)
	}
}

// A request whose turn, as the server's RateLimit fields announced it,
// comes after its own deadline is not sent and not waited for: it fails at
// once with ErrBeyondDeadline, a context.DeadlineExceeded.
func TestAPaceBeyondTheDeadlineIsNotWaited(t *testing.T) {
	cfg, err := rules.Parse("r.yaml", []byte("rules:\n  - {id: r, key: [ip], rate: 1, per: 1h}\n"))
	if err != nil {
		t.Fatal(err)
	}
	e, _ := engine.New(cfg, engine.Options{Store: memory.New(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	var sent atomic.Int64
	ts := httptest.NewServer(httplimit.New(e, httplimit.Options{}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { sent.Add(1) })))
	defer ts.Close()
	c := &http.Client{Transport: &Transport{}}
	resp, err := c.Get(ts.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", ts.URL, nil)
	_, err = c.Do(req)
	if !errors.Is(err, ErrBeyondDeadline) || !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil || sent.Load() != 1 {
		t.Fatalf("a pace an hour away, a deadline 5 s away: %v (context %v, %d sent), want ErrBeyondDeadline at once, 1 sent", err, ctx.Err(), sent.Load())
	}
}
