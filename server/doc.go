// Package server is sluice's decision service: the face that answers a
// question ("may this request pass?") without forwarding anything. One
// Server (New) over one engine serves, on one listener:
//
//   - the JSON API: POST /v1/check and /v1/check:batch (api.go, Server.check
//     → decide → engine.Engine.Check), /v1/charge, /v1/reserve and
//     /v1/settle (reserve.go);
//   - forward-auth for nginx, Traefik, Caddy and Envoy ext_authz
//     (GET /v1/auth; auth.go): the request's life through the same pipeline
//     as the gateway (httplimit.Limiter.Serve), the proxy forwarding;
//   - health and readiness (/healthz, /readyz: the store, each node's
//     breaker, the gateway's upstream when set);
//   - Prometheus metrics (/metrics, package metrics);
//   - the admin endpoints behind the admin token (admin.go: rules, state,
//     hot keys, pressure) and the live page (live.go, /ui).
//
// The gateway (a reverse proxy that applies the rules itself) is package
// gateway, Envoy's gRPC rate limit service package envoy; `sluice gateway`
// also serves this package's health, metrics and admin endpoints on its
// admin listener. Everything about limits, keys, stores and failures is
// decided below, in package engine; this package speaks HTTP and JSON.
// docs/architecture.md draws every face; docs/service.md is the reference.
package server
