// Command bareproxy is a reverse proxy on fasthttp with the settings of
// sluice's gateway (its server and upstream client, timeouts, streaming)
// and no limiter at all: the ceiling of the gateway's data plane on a
// machine, for bench/service/run.sh to put beside nginx, HAProxy and the
// gateway, so that what sluice itself costs stands apart from what the
// HTTP stack costs.
//
//	bareproxy -listen 127.0.0.1:8001 -upstream 127.0.0.1:9000
package main

import (
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
