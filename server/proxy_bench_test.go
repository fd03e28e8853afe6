package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
	"github.com/valyala/fasthttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
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
		{"sluice-gateway", Gateway(u, e, GatewayOptions{})},
	} {
		b.Run(c.name, func(b *testing.B) {
			front := httptest.NewServer(c.h)
			defer front.Close()
			tr := &http.Transport{MaxIdleConnsPerHost: 64}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr}
			parallel(b, func() error {
				req, _ := http.NewRequest("GET", front.URL+"/items", nil)
				req.Header.Set("X-User-ID", "u42")
				resp, err := client.Do(req)
				if err != nil {
					return err
				}
				io.Copy(io.Discard, resp.Body)
				return resp.Body.Close()
			})
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
	body := `{"request":{"method":"GET","path":"/items","ip":"203.0.113.7"},"attributes":{"user":"u42"}}`
	parallel(b, func() error {
		resp, err := client.Post(front.URL+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	})
}

// BenchmarkEnvoyGRPC measures ShouldRateLimit over loopback gRPC with one
// descriptor, clients in parallel: decisions per second and p99.
// BenchmarkEnvoyGRPC: Envoy's rate limit call from a grpc-go client over
// one connection, on sluice's own gRPC server and on grpc-go's.
func BenchmarkEnvoyGRPC(b *testing.B) {
	cfg, _ := rules.Parse("e.yaml", []byte("domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 1000000000}\n"))
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	e, _ := engine.New(cfg, engine.Options{Store: memory.New(), Logger: quiet})
	s, _ := New(Options{Engine: e, Loopback: true, Logger: quiet})
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{{
		Entries: []*ratelimitcommonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "203.0.113.7"}},
	}}}
	for _, server := range []string{"sluice", "grpc-go"} {
		b.Run("server="+server, func(b *testing.B) {
			ln, _ := net.Listen("tcp", "127.0.0.1:0")
			if server == "sluice" {
				g := s.NewEnvoyServer()
				go g.Serve(ln)
				defer g.Close()
			} else {
				g := s.NewGRPCServer()
				s.RegisterEnvoy(g)
				go g.Serve(ln)
				defer g.Stop()
			}
			conn, _ := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			defer conn.Close()
			client := rlsv3.NewRateLimitServiceClient(conn)
			parallel(b, func() error {
				_, err := client.ShouldRateLimit(context.Background(), req)
				return err
			})
		})
	}
}

// parallel runs b.N calls of do over 8 x GOMAXPROCS goroutines and reports
// the calls per second and the p50 and p99 latencies.
func parallel(b *testing.B, do func() error) {
	var mu sync.Mutex
	var lat []time.Duration
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var mine []time.Duration
		for pb.Next() {
			start := time.Now()
			if err := do(); err != nil {
				b.Error(err)
				return
			}
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
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	}
}

// BenchmarkFastGatewayReject measures the gateway's handler on its 429 path
// in process: reading the request's fields, the decision, and writing the
// refusal. The network's part (a read and a write per request, the same
// for any server) is left out, so what sluice itself spends stands out.
func BenchmarkFastGatewayReject(b *testing.B) {
	cfg, err := rules.Parse("b.yaml", []byte("rules:\n  - {id: strict, match: {path: /strict}, key: [ip], rate: 1, per: 1h}\n"))
	if err != nil {
		b.Fatal(err)
	}
	e, err := engine.New(cfg, engine.Options{Store: memory.New(), Logger: quietLog})
	if err != nil {
		b.Fatal(err)
	}
	u, _ := url.Parse("http://127.0.0.1:9")
	g := NewFastGateway(u, e, GatewayOptions{Logger: quietLog})
	var req fasthttp.Request
	req.SetRequestURI("http://gateway.example/strict")
	req.Header.Set("User-Agent", "wrk")
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}, nil)
	res := &engine.Result{}
	e.Check(context.Background(), &rules.Request{Path: "/strict", ClientIP: netip.MustParseAddr("127.0.0.1")}, engine.CheckOptions{}, res) // the one request of the hour
	b.ReportAllocs()
	for b.Loop() {
		ctx.Response.Reset()
		ctx.Response.Header.DisableNormalizing() // as the gateway's server does per request
		g.serve(&ctx)
		if ctx.Response.StatusCode() != http.StatusTooManyRequests {
			b.Fatalf("status %d, want 429", ctx.Response.StatusCode())
		}
	}
}
