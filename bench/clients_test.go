package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	retryablehttp "github.com/hashicorp/go-retryablehttp"
	"github.com/sluice-rl/sluice/client"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

// BenchmarkClients runs N workers per client library, each sending as fast
// as it can for a bounded time to a server limited by sluice (100 at once,
// then 100 a second, per client), and reports the share of the quota used,
// the share of requests answered 429 and the retries sent. Side by side, in
// one run:
//
//	go test -run '^$' -bench Clients -benchtime 1x -count 3
func BenchmarkClients(b *testing.B) {
	const workers, rate = 32, 100
	run := 3 * time.Second
	for _, tc := range []struct {
		name string
		mk   func(retries *atomic.Int64) func(ctx context.Context, url string) (int, error)
	}{
		{"sluice-client", func(retries *atomic.Int64) func(context.Context, string) (int, error) {
			c := &http.Client{Transport: &client.Transport{OnRetry: func(*http.Request, int, time.Duration, *http.Response, error) { retries.Add(1) }}}
			return plainDo(c)
		}},
		{"go-retryablehttp", func(retries *atomic.Int64) func(context.Context, string) (int, error) {
			c := retryablehttp.NewClient()
			c.Logger = nil
			c.RetryMax = 3
			c.RequestLogHook = func(_ retryablehttp.Logger, _ *http.Request, attempt int) {
				if attempt > 0 {
					retries.Add(1)
				}
			}
			c.ErrorHandler = retryablehttp.PassthroughErrorHandler
			return func(ctx context.Context, url string) (int, error) {
				req, _ := retryablehttp.NewRequestWithContext(ctx, "GET", url, nil)
				return drain(c.Do(req))
			}
		}},
		{"net/http", func(*atomic.Int64) func(context.Context, string) (int, error) {
			return plainDo(&http.Client{})
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for range b.N {
				cfg, _ := rules.Parse("r.yaml", []byte(fmt.Sprintf("rules:\n  - {id: per-client, key: [ip], rate: %d, per: 1s}\n", rate)))
				e, _ := engine.New(cfg, engine.Options{Store: memory.New(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
				limited := httplimit.New(e, httplimit.Options{}).Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) }))
				// 429s are counted as the server sends them: those a client
				// retried out of its caller's sight included.
				var sent, sent429 atomic.Int64
				ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					sw := &statusWriter{ResponseWriter: w, code: 200}
					limited.ServeHTTP(sw, r)
					sent.Add(1)
					if sw.code == http.StatusTooManyRequests {
						sent429.Add(1)
					}
				}))
				var retries, ok, refused atomic.Int64
				do := tc.mk(&retries)
				ctx, cancel := context.WithTimeout(context.Background(), run)
				start := time.Now()
				var wg sync.WaitGroup
				for range workers {
					wg.Go(func() {
						for ctx.Err() == nil {
							code, err := do(ctx, ts.URL)
							switch {
							case err != nil:
								if !errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
									b.Error(err)
								}
								return
							case code == 200:
								ok.Add(1)
							default:
								refused.Add(1)
							}
						}
					})
				}
				wg.Wait()
				cancel()
				ts.Close()
				quota := rate + rate*time.Since(start).Seconds()
				b.ReportMetric(100*float64(ok.Load())/quota, "%quota")
				b.ReportMetric(100*float64(sent429.Load())/float64(max(sent.Load(), 1)), "%429")
				b.ReportMetric(float64(refused.Load()), "refused-to-caller")
				b.ReportMetric(float64(retries.Load()), "retries")
				b.ReportMetric(float64(sent.Load()), "requests")
			}
		})
	}
}

func plainDo(c *http.Client) func(context.Context, string) (int, error) {
	return func(ctx context.Context, url string) (int, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
		return drain(c.Do(req))
	}
}

// drain reads and closes an answer's body (so its connection is reused)
// and returns its status.
func drain(resp *http.Response, err error) (int, error) {
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}
