package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
)

// The classic baseline: seven quick requests get 200 x5 with X-RateLimit-Remaining 4, 3,
// 2, 1, 0, then 429, 429 with Retry-After: 1; after 2 s a request gets 200.
func TestBaselineAnswersTheSevenRequestsOfSpec9(t *testing.T) {
	clock := sluice.NewManualClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	h, closeStore, err := newServer(clock)
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	srv := httptest.NewServer(h) // 127.0.0.1, a free port
	defer srv.Close()

	get := func() *http.Response {
		t.Helper()
		resp, err := http.Get(srv.URL + "/")
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for i, want := range []string{"4", "3", "2", "1", "0"} {
		resp := get()
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != want {
			t.Fatalf("request %d: %d with X-RateLimit-Remaining %q, want 200 and %s", i+1, resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"), want)
		}
	}
	for i := 6; i <= 7; i++ {
		resp := get()
		var body struct {
			Error      string `json:"error"`
			RetryAfter int    `json:"retryAfter"`
		}
		err := json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" ||
			resp.Header.Get("X-RateLimit-Remaining") != "0" || body.Error != "Too many requests" || body.RetryAfter != 1 {
			t.Fatalf("request %d: %d, Retry-After %q, remaining %q, body %+v (%v)", i, resp.StatusCode,
				resp.Header.Get("Retry-After"), resp.Header.Get("X-RateLimit-Remaining"), body, err)
		}
	}
	clock.Advance(2 * time.Second)
	if resp := get(); resp.StatusCode != 200 {
		t.Fatalf("after 2 s: %d, want 200", resp.StatusCode)
	}
}
