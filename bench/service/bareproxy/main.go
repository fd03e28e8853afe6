// Command bareproxy is a reverse proxy on fasthttp with the settings of
// sluice's gateway (its server and upstream client, timeouts, streaming)
// and no limiter at all: the ceiling of the gateway's data plane on a
// machine, for bench/service/run.sh to put beside nginx, HAProxy and the
// gateway, so that what sluice itself costs stands apart from what the
// HTTP stack costs. Paths under /strict are answered at once with a 429
// of the gateway's shape (its fields and a problem body of the same size),
// no decision made: the ceiling of the gateway's refusals on the stack.
//
//	bareproxy -listen 127.0.0.1:8001 -upstream 127.0.0.1:9000
package main

import (
	"bytes"
	"flag"
	"log"
	"os"
	"runtime"
	"time"

	"github.com/valyala/fasthttp"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8001", "listen address")
	upstream := flag.String("upstream", "127.0.0.1:9000", "the upstream's host:port")
	flag.Parse()
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(4 * runtime.GOMAXPROCS(0)) // as the gateway: four Ps a CPU
	}
	const timeout = 30 * time.Second
	c := &fasthttp.HostClient{
		Addr: *upstream, MaxConns: 1024, ReadTimeout: timeout, WriteTimeout: timeout, MaxIdleConnDuration: 90 * time.Second,
		StreamResponseBody: true, DisablePathNormalizing: true, NoDefaultUserAgentHeader: true, DisableHeaderNamesNormalizing: true,
	}
	s := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			if bytes.HasPrefix(ctx.Path(), []byte("/strict")) {
				refuse(ctx)
				return
			}
			if err := c.DoTimeout(&ctx.Request, &ctx.Response, timeout); err != nil {
				ctx.SetStatusCode(fasthttp.StatusBadGateway)
			}
		},
		StreamRequestBody: true, DisablePreParseMultipartForm: true, ReadTimeout: timeout, WriteTimeout: timeout,
		IdleTimeout: 2 * time.Minute, ReadBufferSize: 64 << 10, NoDefaultServerHeader: true, DisableHeaderNamesNormalizing: true,
		CloseOnShutdown: true,
	}
	log.Fatal(s.ListenAndServe(*listen))
}

// refusal is the body of the gateway's 429 for a limit of one an hour.
var refusal = []byte(`{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Quota Exceeded","status":429,"detail":"Limit is 1 request per hour. Try again in about 60 minutes.","violated-policies":["strict"]}`)

// refuse writes the fields and body the gateway writes for that refusal.
func refuse(ctx *fasthttp.RequestCtx) {
	h := &ctx.Response.Header
	h.Add("Retry-After", "3600")
	h.Add("Ratelimit-Policy", `"loose";q=1000000000;w=1, "strict";q=1;w=3600`)
	h.Add("Ratelimit", `"strict";r=0;t=3600`)
	h.Add("Cache-Control", "no-store")
	ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
	ctx.SetContentType("application/problem+json")
	ctx.SetBody(refusal)
}
