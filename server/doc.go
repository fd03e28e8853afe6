// Package server is sluice as a running service, in three faces over one
// engine (docs/architecture.md draws them):
//
//   - The decision service (Server, New): the JSON API (POST /v1/check,
//     /v1/check:batch, /v1/charge, /v1/reserve, /v1/settle; api.go,
//     reserve.go), forward-auth for nginx, Traefik, Caddy and Envoy
//     ext_authz (GET /v1/auth; auth.go), health and readiness, Prometheus
//     metrics (metrics.go), and the admin endpoints and live page behind
//     the admin token (admin.go, live.go, hot.go, pressure.go).
//   - The gateway: a reverse proxy that applies the rules itself, on one of
//     two data planes that run the same request pipeline
//     (httplimit.Limiter.Serve) and pass one conformance suite: fasthttp
//     (FastGateway, the default; fastgateway.go) and net/http (Gateway;
//     gateway.go), with protocol upgrades tunnelled only once the upstream
//     switched (upgrade.go).
//   - Envoy's rate limit service (envoy.go): one handler,
//     envoyService.decide over engine.Engine.CheckDescriptors, carried by
//     either gRPC server (NewGRPC: sluice's own HTTP/2 server in
//     internal/h2grpc, the default, or grpc-go), both with gRPC health and
//     both passing one server contract suite.
//
// A request enters the engine through the pipeline (gateway, forward-auth),
// through Engine.Check (the JSON API) or through Engine.CheckDescriptors
// (Envoy). Everything about limits, keys, stores and failures is decided
// below, in package engine; this package speaks protocols. See
// docs/service.md and docs/http.md.
package server
