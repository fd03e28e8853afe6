package gateway

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
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/internal/testkit/benchtest"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/share"
	"github.com/sluice-rl/sluice/store/memory"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
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
		{"sluice-gateway", Handler(u, e, Options{})},
	} {
		b.Run(c.name, func(b *testing.B) {
			front := httptest.NewServer(c.h)
			defer front.Close()
			tr := &http.Transport{MaxIdleConnsPerHost: 64}
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr}
			benchtest.Parallel(b, func() error {
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

// BenchmarkFastGatewayReject measures the gateway's handler on its 429 path
// in process: reading the request's fields, the decision, and writing the
// refusal. The network's part (a read and a write per request, the same
// for any server) is left out, so what sluice itself spends stands out.
func BenchmarkFastGatewayReject(b *testing.B) {
	g, e := benchFast(b, "rules:\n  - {id: strict, match: {path: /strict}, key: [ip], rate: 1, per: 1h}\n")
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

// BenchmarkFastGatewayRejectBrowser is BenchmarkFastGatewayReject with the
// fields a browser sends (twelve, none of them read by the rule): what the
// plane spends on fields the rules do not read.
func BenchmarkFastGatewayRejectBrowser(b *testing.B) {
	g, e := benchFast(b, "rules:\n  - {id: strict, match: {path: /strict}, key: [ip], rate: 1, per: 1h}\n")
	var req fasthttp.Request
	req.SetRequestURI("http://gateway.example/strict")
	for _, f := range [][2]string{
		{"User-Agent", "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36"},
		{"Accept", "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"},
		{"Accept-Language", "en-GB,en;q=0.9"}, {"Accept-Encoding", "gzip, deflate, br, zstd"},
		{"sec-ch-ua", `"Chromium";v="131", "Not_A Brand";v="24"`}, {"sec-ch-ua-mobile", "?0"}, {"sec-ch-ua-platform", `"Linux"`},
		{"Sec-Fetch-Site", "same-origin"}, {"Sec-Fetch-Mode", "navigate"}, {"Sec-Fetch-Dest", "document"},
		{"Referer", "http://gateway.example/"}, {"Upgrade-Insecure-Requests", "1"},
	} {
		req.Header.Set(f[0], f[1])
	}
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}, nil)
	res := &engine.Result{}
	e.Check(context.Background(), &rules.Request{Path: "/strict", ClientIP: netip.MustParseAddr("127.0.0.1")}, engine.CheckOptions{}, res)
	b.ReportAllocs()
	for b.Loop() {
		ctx.Response.Reset()
		ctx.Response.Header.DisableNormalizing()
		g.serve(&ctx)
		if ctx.Response.StatusCode() != http.StatusTooManyRequests {
			b.Fatalf("status %d, want 429", ctx.Response.StatusCode())
		}
	}
}

// BenchmarkFastGatewayForward measures the fasthttp plane's forwarding in
// process, beside the same upstream client with no gateway around it
// ("client"): the upstream is a fasthttp server on an in-memory listener,
// so what "gateway" spends over "client" is the gateway's own (the
// pipeline, the decision, the forwarding fields, the hop-by-hop removal)
// and not the network's.
func BenchmarkFastGatewayForward(b *testing.B) {
	ln := fasthttputil.NewInmemoryListener()
	defer ln.Close()
	up := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok\n") }}
	go up.Serve(ln)
	defer up.Shutdown()
	g, _ := benchFast(b, "rules:\n  - {id: loose, key: [ip], rate: 1000000000, per: 1s}\n")
	g.client.DialTimeout = func(string, time.Duration) (net.Conn, error) {
		c, err := ln.Dial()
		return &upstreamConn{Conn: c, u: g.conns}, err
	}
	peer := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
	b.Run("client", func(b *testing.B) {
		var req fasthttp.Request
		var resp fasthttp.Response
		b.ReportAllocs()
		for b.Loop() {
			req.SetRequestURI("http://127.0.0.1:9/items")
			req.Header.Set("User-Agent", "wrk")
			if err := g.client.Do(&req, &resp); err != nil || resp.StatusCode() != 200 || string(resp.Body()) != "ok\n" {
				b.Fatalf("%v %d", err, resp.StatusCode())
			}
			resp.CloseBodyStream()
			req.Reset()
			resp.Reset()
		}
	})
	b.Run("gateway", func(b *testing.B) {
		var req fasthttp.Request
		var ctx fasthttp.RequestCtx
		b.ReportAllocs()
		for b.Loop() {
			req.SetRequestURI("http://gateway.example/items")
			req.Header.Set("User-Agent", "wrk")
			ctx.Init(&req, peer, nil)
			ctx.Request.Header.DisableNormalizing()
			ctx.Response.Header.DisableNormalizing()
			g.serve(&ctx)
			if ctx.Response.StatusCode() != 200 || string(ctx.Response.Body()) != "ok\n" { // Body reads the stream whole, as the server writing it out
				b.Fatalf("status %d", ctx.Response.StatusCode())
			}
			ctx.Response.CloseBodyStream()
			req.Reset()
			ctx.Response.Reset()
		}
	})
}

// benchFast is the fasthttp plane over an engine of rulesYAML on the
// embedded store behind the share layer (as `sluice gateway` runs it), its
// upstream a closed port unless the benchmark dials another.
func benchFast(b *testing.B, rulesYAML string) (*Fast, *engine.Engine) {
	b.Helper()
	cfg, err := rules.Parse("b.yaml", []byte(rulesYAML))
	if err != nil {
		b.Fatal(err)
	}
	store, sh := share.Wrap(memory.New(), share.Options{
		Local: memory.New(), NoDenyCache: true,
		Sharing:  func(string) sluice.Sharing { return sluice.Sharing{} },
		Scale:    func(string) float64 { return 1 },
		AllExact: func() bool { return true }, // as sluice gateway says of rules with no sync: and no regions
	})
	b.Cleanup(sh.Close)
	e, err := engine.New(cfg, engine.Options{Store: store, Logger: quietLog})
	if err != nil {
		b.Fatal(err)
	}
	u, _ := url.Parse("http://127.0.0.1:9")
	return NewFast(u, e, Options{Logger: quietLog}), e
}
