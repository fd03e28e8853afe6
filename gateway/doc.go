// Package gateway is `sluice gateway`: a reverse proxy in front of one
// upstream that applies the rules itself, so that a refused request never
// reaches the upstream.
//
// A gateway is one of two data planes (New, by name; Planes):
//
//   - "fasthttp" (Fast, the default; fast.go): fasthttp's server and
//     clients, HTTP/1.x to clients, pooled upstream connections looked at
//     before each reuse (upstreamconn.go);
//   - "net/http" (Handler; nethttp.go): httputil.ReverseProxy behind the
//     net/http middleware, HTTP/2 to clients too.
//
// Both run the same request pipeline (httplimit.Limiter.Serve: check,
// refuse or delay, the concurrency permit, forward, charge and settle),
// each as an httplimit.Exchange that supplies only its bytes
// (fastexchange.go for fasthttp); both map an upstream's failure to the
// same 502 or 504 (upstreamerr.go), drop the same hop-by-hop fields
// (hop.go), and pass a protocol upgrade (WebSocket) on through one flow,
// upgrader.serve, tunnelled only once the upstream answered 101
// (upgrade.go; each plane supplies an upgradeSide: fastupgrade.go,
// nethttp.go). One conformance suite holds the
// two planes, and forward-auth behind nginx, to the same behaviour
// (planes_test.go, planes_odd_test.go). docs/http.md is the reference.
package gateway
