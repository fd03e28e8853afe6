package llm_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/examples/llm"
	"github.com/sluice-rl/sluice/internal/testkit/proctest"
)

// gateway runs the built `sluice gateway` with this example's rule file
// as written, with its default flags, in front of upstream; it returns the
// gateway's and the admin listener's base URLs.
func gateway(t *testing.T, upstream string) (string, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	admin := ln.Addr().String()
	ln.Close()
	var log proctest.Output // the gateway's log (a line per refusal), shown if the test fails
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("gateway log:\n%s", log.String())
		}
	})
	base, _ := proctest.Start(t, &log, "gateway", "--config", "rules.yaml", "--upstream", upstream,
		"--listen", "127.0.0.1:0", "--admin-listen", admin, "--watch", "0")
	return base, "http://" + admin
}

// setUp starts the fake completion API behind its ledger and the gateway
// in front of it.
func setUp(t *testing.T) (led *ledger, base, admin string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	led = &ledger{tokens: map[string]int64{}, calls: map[string]int{}}
	up := httptest.NewServer(led.handler())
	t.Cleanup(up.Close)
	base, admin = gateway(t, up.URL)
	return led, base, admin
}

func TestMain(m *testing.M) { proctest.Main(m) }

// ledger is the upstream's own count of the tokens it served, per API key:
// the truth the gateway's count must match.
type ledger struct {
	mu     sync.Mutex
	tokens map[string]int64
	calls  map[string]int
}

func (l *ledger) handler() http.Handler {
	inner := llm.Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req llm.ChatRequest
		json.Unmarshal(body, &req)
		u := llm.Tokens(&req)
		l.mu.Lock()
		key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		l.tokens[key] += u.TotalTokens
		l.calls[key]++
		l.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		inner.ServeHTTP(w, r)
	})
}

func (l *ledger) of(key string) (int64, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.tokens[key], l.calls[key]
}

// completion is one request: its max_tokens (0: none, the rule's 1,000),
// prompt length in bytes and the answer's length.
type completion struct {
	maxTokens, promptBytes, answer int64
}

func (c completion) body() string {
	req := map[string]any{"model": "fake", "fake_completion_tokens": c.answer,
		"messages": []any{map[string]string{"role": "user", "content": strings.Repeat("x", int(c.promptBytes))}}}
	if c.maxTokens > 0 {
		req["max_tokens"] = c.maxTokens
	}
	b, _ := json.Marshal(req)
	return string(b)
}

func (c completion) estimate() int64 {
	return map[bool]int64{true: c.maxTokens, false: 1000}[c.maxTokens > 0]
}

func (c completion) actual() int64 {
	var req llm.ChatRequest
	json.Unmarshal([]byte(c.body()), &req)
	return llm.Tokens(&req).TotalTokens
}

func send(t *testing.T, base, key string, c completion) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(c.body()))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func remaining(t *testing.T, admin, rule, key string) int64 {
	t.Helper()
	resp, err := http.Get(admin + "/v1/state?rule=" + rule + "&api_key=" + key)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st struct{ Remaining int64 }
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != 200 {
		t.Fatalf("state: %d %v", resp.StatusCode, err)
	}
	return st.Remaining
}

// inOneMinute runs try, with a fresh key prefix each time, until a try
// begins and ends in one calendar minute: the budget is per minute (a fixed
// window), and a try that straddles two windows sees two budgets, which
// says nothing of either. A try that straddled is said and made again, at
// most three times; what the last try found is the test's verdict. A try
// that would begin in a minute's last 5 s waits for the next minute.
func inOneMinute(t *testing.T, try func(prefix string) error) {
	t.Helper()
	for n := 1; ; n++ {
		if left := time.Minute - time.Duration(time.Now().UnixNano())%time.Minute; left < 5*time.Second {
			time.Sleep(left + 50*time.Millisecond)
		}
		began := time.Now().Truncate(time.Minute)
		err := try(fmt.Sprintf("try%d-", n))
		if time.Now().Truncate(time.Minute).Equal(began) || n == 3 {
			if err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Logf("try %d straddled two minutes, two budgets (%v): again with fresh keys", n, err)
	}
}

// The token budget is held exactly when estimates are wrong both ways:
// after every request, what the gateway counts is what the upstream served,
// to the token; a request whose estimate does not fit is refused before
// the upstream sees it; and the one request that went over the budget (its
// estimate fitted, its answer did not) leaves the key in debt, so nothing
// more passes in that minute.
func TestTheTokenBudgetIsHeldExactly(t *testing.T) {
	led, base, admin := setUp(t)
	inOneMinute(t, func(prefix string) error { return budgetHeldExactly(t, led, base, admin, prefix+"sk-careful") })
}

func budgetHeldExactly(t *testing.T, led *ledger, base, admin, key string) error {
	const budget = 10000
	steps := []completion{
		{maxTokens: 2000, promptBytes: 40, answer: 50},   // over-estimated: 60 used
		{maxTokens: 100, promptBytes: 4000, answer: 500}, // under: 1,100 used
		{maxTokens: 0, promptBytes: 400, answer: 300},    // the rule's 1,000: 400 used
		{maxTokens: 500, promptBytes: 8000, answer: 900}, // under: 2,500 used
		{maxTokens: 3000, promptBytes: 12, answer: 10},   // over: 13 used
		{maxTokens: 50, promptBytes: 12000, answer: 80},  // under: 3,050 used
	}
	var used int64
	for i, c := range steps {
		if resp := send(t, base, key, c); resp.StatusCode != 200 {
			return fmt.Errorf("step %d: %d", i, resp.StatusCode)
		}
		used += c.actual()
		if served, _ := led.of(key); served != used {
			return fmt.Errorf("step %d: the upstream served %d, want %d", i, served, used)
		}
		if got := remaining(t, admin, "tokens-per-minute", key); got != budget-used {
			return fmt.Errorf("step %d (estimate %d, used %d): %d tokens left, want %d", i, c.estimate(), c.actual(), got, budget-used)
		}
		if got := remaining(t, admin, "requests-per-minute", key); got != int64(20-i-1) {
			return fmt.Errorf("step %d: %d requests left, want %d", i, got, 20-i-1)
		}
	}
	// 2,877 left: an estimate of 4,000 does not fit, and never reaches the
	// upstream.
	_, calls := led.of(key)
	if resp := send(t, base, key, completion{maxTokens: 4000, promptBytes: 4, answer: 4000}); resp.StatusCode != 429 {
		return fmt.Errorf("an estimate beyond what is left: %d, want 429", resp.StatusCode)
	}
	if _, c := led.of(key); c != calls {
		return fmt.Errorf("a refused request reached the upstream")
	}
	// An estimate of 2,000 fits, its answer of 3,000 does not: 123 over.
	last := completion{maxTokens: 2000, promptBytes: 4000, answer: 2000}
	if resp := send(t, base, key, last); resp.StatusCode != 200 {
		return fmt.Errorf("the last request: %d", resp.StatusCode)
	}
	used += last.actual()
	served, _ := led.of(key)
	if served != used || served != budget+123 {
		return fmt.Errorf("served %d tokens, counted %d, want %d", served, used, budget+123)
	}
	resp := send(t, base, key, completion{maxTokens: 1, promptBytes: 1, answer: 1})
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		return fmt.Errorf("in debt: %d (Retry-After %q), want 429 until the minute ends", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if got := remaining(t, admin, "tokens-per-minute", key); got != 0 {
		return fmt.Errorf("in debt: %d left", got)
	}
	t.Logf("budget %d: served %d tokens in %d requests; the one overshoot was the last answer's %d tokens beyond what was left",
		budget, served, len(steps)+1, 123)
	return nil
}

// Sixty-four clients at once, every estimate wrong one way or the other:
// the count still equals what the upstream served, and it went over the
// budget by no more than the understatements of the requests admitted.
func TestTheBudgetHoldsUnderSixtyFourClients(t *testing.T) {
	led, base, admin := setUp(t)
	inOneMinute(t, func(prefix string) error { return budgetHoldsUnderLoad(t, led, base, admin, prefix) })
}

func budgetHoldsUnderLoad(t *testing.T, led *ledger, base, admin, prefix string) error {
	const clients = 64
	var mu sync.Mutex
	var under int64 // what the admitted requests' estimates understated
	var admitted int
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			c := completion{maxTokens: 2000, promptBytes: 40, answer: 100} // over-estimated
			if i%2 == 1 {
				c = completion{maxTokens: 200, promptBytes: 4000, answer: 200} // under: 1,200
			}
			key := fmt.Sprintf("%ssk-team-%d", prefix, i%2)
			if resp := send(t, base, key, c); resp.StatusCode == 200 {
				mu.Lock()
				admitted++
				under += max(0, c.actual()-c.estimate())
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	var errs []error
	for _, key := range []string{prefix + "sk-team-0", prefix + "sk-team-1"} {
		served, calls := led.of(key)
		left := remaining(t, admin, "tokens-per-minute", key)
		if served <= 10000 && left != 10000-served {
			errs = append(errs, fmt.Errorf("%s: served %d tokens in %d answers, the gateway has %d left, want %d", key, served, calls, left, 10000-served))
		}
		if served > 10000 && left != 0 {
			errs = append(errs, fmt.Errorf("%s: served %d, over the budget, yet %d left", key, served, left))
		}
		if calls > 20 {
			errs = append(errs, fmt.Errorf("%s: %d answers, beyond 20 requests a minute", key, calls))
		}
	}
	total, _ := led.of(prefix + "sk-team-1")
	if total > 10000+under {
		errs = append(errs, fmt.Errorf("sk-team-1 was served %d tokens: beyond the budget by more than the %d its estimates understated", total, under))
	}
	if total < 10000-200 {
		errs = append(errs, fmt.Errorf("sk-team-1 was served only %d tokens of 10,000 while its clients kept asking", total))
	}
	zero, _ := led.of(prefix + "sk-team-0")
	t.Logf("%d of %d requests admitted; sk-team-0 served %d, sk-team-1 served %d (understated by %d in all)",
		admitted, clients, zero, total, under)
	return errors.Join(errs...)
}
