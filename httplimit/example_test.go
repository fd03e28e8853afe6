package httplimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

// The middleware limits a handler by the rules: a request over a limit is
// answered 429 with Retry-After, the RateLimit fields and a problem+json
// body, and never reaches the handler.
func ExampleMiddleware() {
	cfg, err := rules.Parse("rules.yaml", []byte(`
rules:
  - id: per-ip
    key: [ip]
    rate: 2
    per: 1m
`))
	if err != nil {
		panic(err)
	}
	store := memory.New()
	defer store.Close()
	e, err := engine.New(cfg, engine.Options{Store: store})
	if err != nil {
		panic(err)
	}
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "hello") })
	h := httplimit.Middleware(e, httplimit.Options{})(hello)

	for range 3 {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "192.0.2.7:50000"
		h.ServeHTTP(w, r)
		fmt.Printf("%d %q %q\n", w.Code, w.Header().Get("RateLimit"), w.Header().Get("Retry-After"))
	}
	// Output:
	// 200 "\"per-ip\";r=1" ""
	// 200 "\"per-ip\";r=0" ""
	// 429 "\"per-ip\";r=0;t=30" "30"

}
