// Package httplimit puts sluice in front of net/http handlers: a middleware
// (func(http.Handler) http.Handler) that checks each request against an
// engine's rules and answers by the book when it is over a limit.
//
// It owns the request pipeline every HTTP plane of sluice runs,
// Limiter.Serve: the check, the refusal, the leaky-queue delay, the
// concurrency permit, the forwarding and, after the response, the countOn
// charge and the settling of reservations, in that order. A plane is an
// Exchange (the middleware's httpExchange here; the gateway's planes in
// package gateway, forward-auth in package server, a gRPC call or stream
// message in package grpclimit) and adds nothing to the request's life.
// What every plane shares besides is here too: whose forwarding fields are
// believed (Trust, Options.Trust) and the kept rendering of a refusal
// (Refusal). The limits themselves are decided in package engine.
//
// A rejected request gets 429 Too Many Requests (503 when a fail-closed rule
// cannot reach its store), Retry-After in whole seconds (at least 1, never
// earlier than the RateLimit header's t), the IETF RateLimit-Policy and
// RateLimit fields, Cache-Control: no-store, and an RFC 9457
// application/problem+json body naming the violated rules (never a store
// error or another key). Allowed responses carry RateLimit-Policy and
// RateLimit too (always, near the limit, or never); the legacy
// X-RateLimit-Limit/-Remaining/-Reset fields are an option.
//
// Leaky-queue rules delay the request by their decision's delay (up to a
// maximum), and a client that gives up while queued gets its units back.
// countOn rules are charged after the handler has written its status.
//
// The client address is the socket's peer unless that peer is a trusted
// proxy; then it is the right-most address of X-Forwarded-For (or RFC 7239
// Forwarded) that is not a trusted proxy. Malformed headers fall back to the
// peer; headers from untrusted peers are ignored. See docs/http.md.
package httplimit
