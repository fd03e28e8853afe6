package httplimit

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

func TestActualFromReadsOnlyWholeNumbers(t *testing.T) {
	js := &rules.Reserve{ActualJSON: []string{"usage", "total_tokens"}}
	for body, want := range map[string]int64{
		`{"usage":{"total_tokens":42}}`:                      42,
		`{"usage":{"total_tokens":0}}`:                       0,
		`{"usage":{"total_tokens":9223372036854775807}}`:     9223372036854775807,
		`{"usage":{"total_tokens":9223372036854775808}}`:     -1, // beyond int64
		`{"usage":{"total_tokens":-5}}`:                      -1,
		`{"usage":{"total_tokens":4.5}}`:                     -1,
		`{"usage":{"total_tokens":1e3}}`:                     -1,
		`{"usage":{"total_tokens":"42"}}`:                    -1,
		`{"usage":[42]}`:                                     -1,
		`{"usage":null}`:                                     -1,
		`{"usage":{"prompt_tokens":3}}`:                      -1,
		`{"usage":{"total_tokens":42}`:                       -1, // cut short
		``:                                                   -1,
		`[]`:                                                 -1,
		`{"usage":{"total_tokens":7}} trailing`:              7,  // the first document decides
		`{"usage":{"total_tokens":1,"total_tokens":9}}`:      9,  // the last duplicate, as encoding/json
		`{"a":"` + strings.Repeat("x", MaxSettleBody) + `"}`: -1, // longer than read
	} {
		n, ok := ActualFrom(js, nil, []byte(body))
		if got := map[bool]int64{true: n, false: -1}[ok]; got != want {
			t.Errorf("%.50s: %d (%v), want %d", body, n, ok, want)
		}
	}
	hd := &rules.Reserve{ActualHeader: "X-Tokens-Used"}
	for v, want := range map[string]int64{"12": 12, " 12 ": 12, "": -1, "-1": -1, "1.5": -1, "0x10": -1, "99999999999999999999": -1} {
		n, ok := ActualFrom(hd, func(string) string { return v }, nil)
		if got := map[bool]int64{true: n, false: -1}[ok]; got != want {
			t.Errorf("header %q: %d (%v), want %d", v, n, ok, want)
		}
	}
}

// Through the net/http middleware, a reservation is settled from the
// handler's JSON answer: an estimate of 100, an answer of 30 tokens, 70
// given back.
func TestTheMiddlewareSettlesFromTheJSONAnswer(t *testing.T) {
	cfg, err := rules.Parse("test.yaml", []byte(`
rules:
  - {id: tokens, key: [user], rate: 1000, per: 1h, algorithm: fixed-window, reserve: {estimate: 100, actualJSON: usage.total_tokens}}
`))
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(cfg, engine.Options{Store: memory.New(memory.WithClock(sluice.NewManualClock(epoch)))})
	if err != nil {
		t.Fatal(err)
	}
	h := Middleware(eng, Options{})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"usage":{"total_tokens":30}}`)
	}))
	r := httptest.NewRequest("POST", "/v1/chat", nil)
	r.Header.Set("X-User-Id", "u")
	h.ServeHTTP(httptest.NewRecorder(), r)
	if d, _, _ := eng.Inspect(context.Background(), "tokens", "u"); d.Remaining != 1000-30 {
		t.Fatalf("after a call that used 30 tokens: %d left, want %d", d.Remaining, 1000-30)
	}
}
