package server

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/metrics"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

// A batch answered 400 consumes nothing: every item is validated first.
func TestBadBatchConsumesNothing(t *testing.T) {
	f := newFixture(t, Options{Loopback: true})
	item := `{"attributes":{"phone":"8801"}}`
	w := f.do("POST", "/v1/check:batch", "["+strings.Repeat(item+",", 5)+`{"cost":0}]`)
	if w.Code != 400 {
		t.Fatalf("bad batch: %d %s", w.Code, w.Body)
	}
	// The otp rule allows one per 10 minutes: still there.
	w = f.do("POST", "/v1/check", item)
	var resp CheckResponse
	json.Unmarshal(w.Body.Bytes(), &resp)
	if !resp.Allowed {
		t.Fatalf("the refused batch consumed the otp unit: %s", w.Body)
	}
}

// JSON cannot carry invalid UTF-8 or lone surrogates exactly (they decode to
// U+FFFD): such bodies are refused, so two keys can never merge.
func TestBodiesThatCannotCarryKeysExactlyAreRefused(t *testing.T) {
	f := newFixture(t, Options{Loopback: true})
	for _, body := range []string{
		"{\"attributes\":{\"phone\":\"\xff\"}}",
		`{"attributes":{"phone":"\udc80"}}`,
		`{"attributes":{"phone":"\ud800x"}}`,
		`{"attributes":{"phone":"\ud800\u0041"}}`,
	} {
		if w := f.do("POST", "/v1/check", body); w.Code != 400 || !strings.Contains(w.Header().Get("Content-Type"), "problem+json") {
			t.Errorf("%q: %d %s", body, w.Code, w.Body)
		}
	}
	for _, body := range []string{
		`{"attributes":{"phone":"\ud83d\ude00"}}`, // a valid pair
		`{"attributes":{"phone":"\\udc80"}}`,      // an escaped backslash, then text
		`{"attributes":{"phone":"€ ✓"}}`,
	} {
		if w := f.do("POST", "/v1/check", body); w.Code != 200 {
			t.Errorf("%q: %d %s", body, w.Code, w.Body)
		}
	}
}

type panicStore struct{}

func (panicStore) Take(context.Context, []sluice.Take, []sluice.Decision) error {
	panic("a bug reached by a request")
}

// No input may crash the process: a panic below a request is answered 500
// and counted (package metrics holds the gRPC boundary to the same).
func TestPanicsAreAnsweredAndCounted(t *testing.T) {
	g := newFixture(t, Options{Loopback: true})
	cfg, err := rules.Parse("test.yaml", []byte(testRules))
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(cfg, engine.Options{Store: panicStore{}, Logger: g.srv.log})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Options{Engine: e, Loopback: true, Metrics: metrics.New("t"), Logger: g.srv.log})
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, httptest.NewRequest("POST", "/v1/check", strings.NewReader(`{"attributes":{"phone":"1"}}`)))
	if w.Code != 500 || !strings.Contains(w.Header().Get("Content-Type"), "problem+json") {
		t.Fatalf("panic over HTTP: %d %s", w.Code, w.Body)
	}
	h := httptest.NewRecorder()
	srv.ServeHTTP(h, httptest.NewRequest("GET", "http://127.0.0.1/metrics", nil))
	if !strings.Contains(h.Body.String(), `sluice_panics_total{boundary="http"} 1`) {
		t.Fatal("the panic was not counted")
	}
}

// downStore fails every call.
type downStore struct{}

func (downStore) Take(context.Context, []sluice.Take, []sluice.Decision) error {
	return errors.New("connection refused")
}

// /v1/charge while the store does not answer: the charge is counted in the
// gateway's share and said degraded, not refused with 503 and lost.
func TestAChargeWhileTheStoreIsDownIsCountedAndSaidDegraded(t *testing.T) {
	g := newFixture(t, Options{Loopback: true})
	cfg, err := rules.Parse("test.yaml", []byte("rules:\n  - {id: login, match: {path: /login}, key: [user], rate: 3, per: 1h, countOn: {status: [401]}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(cfg, engine.Options{Store: downStore{}, Fallback: memory.New(), Logger: g.srv.log})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Options{Engine: e, Loopback: true, Metrics: metrics.New("t"), Logger: g.srv.log})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"request":{"method":"POST","path":"/login","headers":{"X-User-Id":"u"}},"status":401}`
	for i := range 3 {
		w := httptest.NewRecorder()
		srv.ServeHTTP(w, httptest.NewRequest("POST", "/v1/charge", strings.NewReader(body)))
		if w.Code != 200 || !strings.Contains(w.Body.String(), `"degraded":true`) {
			t.Fatalf("charge %d with the store down: %d %s", i+1, w.Code, w.Body)
		}
	}
	w := httptest.NewRecorder()
	srv.ServeHTTP(w, httptest.NewRequest("POST", "/v1/check", strings.NewReader(`{"request":{"method":"POST","path":"/login","headers":{"X-User-Id":"u"}}}`)))
	if !strings.Contains(w.Body.String(), `"allowed":false`) {
		t.Fatalf("a check after three failures charged while the store was down: %d %s", w.Code, w.Body)
	}
}
