package redis_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
	"github.com/sluice-rl/sluice/store/redis"
	"github.com/sluice-rl/sluice/store/redis/redistest"
	"github.com/sluice-rl/sluice/storecall"
)

// Faults, with the engine on a Redis store behind a TCP proxy: Redis stopped
// mid-run, restarted empty (its scripts lost: NOSCRIPT), and slowed.
func TestFaultsStopRestartAndSlowRedis(t *testing.T) {
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	store, err := redis.New(redis.Options{URL: "redis://" + proxy.Addr})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	cfg, _ := rules.Parse("f.yaml", []byte(`
rules:
  - {id: open, key: [user], rate: 100, per: 1h, fallback: {rate: 1000, per: 1h}}
  - {id: otp, match: {path: /otp}, key: [user], rate: 3, per: 10m, failMode: closed}
`))
	var changes []string
	e, err := engine.New(cfg, engine.Options{
		Store: store, Fallback: memory.New(), Calls: storecall.Options{
			Timeout: 100 * time.Millisecond, BreakerFailures: 3, BreakerOpenFor: 100 * time.Millisecond,
			OnBreakerChange: func(from, to string) { changes = append(changes, to) },
		},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	req := func(path string) *rules.Request {
		return &rules.Request{Method: "POST", Path: path, Header: http.Header{"X-User-Id": {"u42"}}}
	}
	check := func(path string) *engine.Result {
		var res engine.Result
		done := make(chan struct{})
		go func() { e.Check(context.Background(), req(path), engine.CheckOptions{}, &res); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second): // a hang, not a duration assertion
			t.Fatal("a check hung on the store")
		}
		return &res
	}

	// Healthy: counted in Redis.
	if res := check("/otp"); !res.Allowed || res.StoreError != nil || res.Statuses[1].Remaining != 2 {
		t.Fatalf("healthy: %+v", res)
	}

	// Stopped: answered, fail open with the fallback, fail closed rejects,
	// and the breaker opens.
	srv.Stop()
	for range 5 {
		res := check("/otp")
		if res.StoreError == nil || res.Allowed || res.Reason != sluice.ReasonUnavailable {
			t.Fatalf("Redis down, fail-closed rule: %+v", res)
		}
		if open := check("/items"); !open.Allowed || !open.Statuses[0].FailedOpen {
			t.Fatalf("Redis down, fail-open rule: %+v", open)
		}
	}
	if s := e.Store().BreakerState(); s != "open" {
		t.Fatalf("breaker %s with Redis down", s)
	}
	if res := check("/items"); !errors.Is(res.StoreError, storecall.ErrBreakerOpen) {
		t.Fatalf("open breaker still calls the store: %v", res.StoreError)
	}

	// Restarted empty: the scripts are reloaded, the breaker closes, counting
	// resumes. (A call or two may still meet a connection the restart broke.)
	srv.Restart()
	nextSuccess := func() *engine.Result {
		deadline := time.Now().Add(20 * time.Second)
		for {
			res := check("/otp")
			if res.StoreError == nil {
				return res
			}
			if time.Now().After(deadline) {
				t.Fatalf("breaker %s and store error %v 20s after Redis came back", e.Store().BreakerState(), res.StoreError)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	first := nextSuccess()
	if !first.Allowed || first.Statuses[1].Remaining != 2 {
		t.Fatalf("after the restart the count should start fresh: %+v", first.Statuses)
	}
	if second := nextSuccess(); second.Statuses[1].Remaining != 1 {
		t.Fatalf("counting did not resume: %+v", second.Statuses)
	}
	if s := e.Store().BreakerState(); s != "closed" {
		t.Fatalf("breaker %s after successful calls", s)
	}

	// Slowed far beyond the deadline: still answered, failing open. (The
	// error is the deadline, or the connection the client dropped when an
	// earlier call's deadline cut it mid-reply.)
	proxy.SetDelay(time.Second)
	res := check("/items")
	if res.StoreError == nil || !res.Allowed || !res.Statuses[0].FailedOpen {
		t.Fatalf("slow Redis: %v, allowed %v", res.StoreError, res.Allowed)
	}
	proxy.SetDelay(0)
	if len(changes) < 3 || changes[0] != "open" {
		t.Fatalf("breaker changes %v", changes)
	}
}
