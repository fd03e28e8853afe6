// Command basic is the classic single-process baseline limiter, built from sluice's parts: a
// JSON endpoint limited per client IP with a token bucket of capacity 5
// refilled at 1 token per second, X-RateLimit-Remaining on every response,
// and 429 with Retry-After and {"error":"Too many requests","retryAfter":N}
// when over. Idle keys are swept from memory every 10 minutes.
//
//	PORT=3921 go run ./examples/basic
//	curl -i http://127.0.0.1:3921/
package main

import (
	"encoding/json"
	"log"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

const ruleFile = `
rules:
  - id: per-ip
    key: [ip]
    rate: 1
    per: 1s
    burst: 5
    algorithm: token-bucket
`

// newServer returns the limited endpoint, reading time from clock.
func newServer(clock sluice.Clock) (http.Handler, func(), error) {
	cfg, err := rules.Parse("basic.yaml", []byte(ruleFile))
	if err != nil {
		return nil, nil, err
	}
	store := memory.New(memory.WithClock(clock), memory.WithSweepEvery(10*time.Minute))
	eng, err := engine.New(cfg, engine.Options{Store: store})
	if err != nil {
		return nil, nil, err
	}
	limit := httplimit.Middleware(eng, httplimit.Options{
		LegacyHeaders: true, // X-RateLimit-Remaining on every response
		OnReject: func(w http.ResponseWriter, r *http.Request, res *engine.Result) {
			retry, _ := strconv.Atoi(w.Header().Get("Retry-After"))
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			json.NewEncoder(w).Encode(map[string]any{"error": "Too many requests", "retryAfter": retry})
		},
	})
	hello := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"message":"hello"}` + "\n"))
	})
	return limit(hello), func() { store.Close() }, nil
}

func main() {
	port := os.Getenv("PORT")
	if port == "" {
		port = "3921"
	}
	h, closeStore, err := newServer(sluice.NewSystemClock())
	if err != nil {
		log.Fatal(err)
	}
	defer closeStore()
	addr := "127.0.0.1:" + port
	log.Printf("basic: serving on http://%s/ (5 at once, then 1 per second, per client IP)", addr)
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}
	log.Fatal(srv.ListenAndServe())
}
