package server

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

// BenchmarkProxy compares sluice's gateway with a bare httputil.ReverseProxy
// to the same upstream, all on loopback, with keep-alive clients in
// parallel. It reports the p50 and p99 latency of each.
func BenchmarkProxy(b *testing.B) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"ok":true}`))
	}))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	cfg, _ := rules.Parse("b.yaml", []byte("rules:\n  - {id: per-ip, key: [ip], rate: 1000000000, per: 1s}\n  - {id: per-user, key: [user], rate: 1000000000, per: 1s}\n"))
	e, _ := engine.New(cfg, engine.Options{Store: memory.New(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	for _, c := range []struct {
		name string
		h    http.Handler
	}{
		{"bare", &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(u); pr.SetXForwarded() }}},
		{"sluice-gateway", Gateway(u, e, httplimit.Options{}, nil)},
	} {
		b.Run(c.name, func(b *testing.B) {
			front := httptest.NewServer(c.h)
			defer front.Close()
			tr := &http.Transport{MaxIdleConnsPerHost: 64}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr}
			var mu sync.Mutex
			var lat []time.Duration
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var mine []time.Duration
				req, _ := http.NewRequest("GET", front.URL+"/items", nil)
				req.Header.Set("X-User-ID", "u42")
				for pb.Next() {
					start := time.Now()
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					mine = append(mine, time.Since(start))
				}
				mu.Lock()
				lat = append(lat, mine...)
				mu.Unlock()
			})
			b.StopTimer()
			if len(lat) > 0 {
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			}
		})
	}
}

// BenchmarkCheckAPI measures POST /v1/check over loopback HTTP with
// keep-alive clients in parallel: decisions per second and p99.
func BenchmarkCheckAPI(b *testing.B) {
	cfg, _ := rules.Parse("b.yaml", []byte("rules:\n  - {id: per-user, key: [user], rate: 1000000000, per: 1s}\n  - {id: per-ip, key: [ip], rate: 1000000000, per: 1s}\n"))
	e, _ := engine.New(cfg, engine.Options{Store: memory.New(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	srv, _ := New(Options{Engine: e, Loopback: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	front := httptest.NewServer(srv)
	defer front.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var mu sync.Mutex
	var lat []time.Duration
	body := `{"request":{"method":"GET","path":"/items","ip":"203.0.113.7"},"attributes":{"user":"u42"}}`
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			start := time.Now()
			resp, err := client.Post(front.URL+"/v1/check", "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			mine = append(mine, time.Since(start))
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
	if len(lat) > 0 {
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	}
}
