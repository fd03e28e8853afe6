// Package grpclimit applies sluice's rules to gRPC services in Go: server
// interceptors that decide each call with the same engine, rules and
// stores as the HTTP faces, and client interceptors that wait as a server
// asks.
//
// A call is the request the rules see as POST on its full method name
// (/pkg.Service/Method), so that `match: {path: "/pkg.Service/*"}` selects
// a service and a rule without a match counts every call. Its metadata are
// the request's header fields (header sources read them), its peer is the
// client behind the rule file's trustedProxies (as on HTTP), and
// Options.Attributes puts what the service knows (an authenticated
// identity) in the request's attributes. The request message is, for rules
// that read a body, their JSON body (protobuf's JSON): a key or a reserve
// rule's estimate from a field of the message. A stream is decided when it
// opens; each message the server receives on it is decided as a request of
// method MESSAGE on the same path, which only rules that name MESSAGE count
// (`match: {method: MESSAGE, path: /pkg.Service/Upload}`).
//
// A call goes through the pipeline every HTTP plane runs
// (httplimit.Limiter.Serve): the check, all or nothing; a refusal; a
// leaky-queue delay, given back if the caller leaves; the concurrency
// permit; the call; then countOn charges from its status, read in HTTP
// terms (Unauthenticated is 401, PermissionDenied 403, ...), and the
// pressure adaptive rules follow. A refusal is codes.ResourceExhausted
// with google.rpc.RetryInfo (the wait) and google.rpc.QuotaFailure (the
// rules that refused, as subjects); a refusal under the service's pressure,
// a fail-closed rule without its store, and the concurrency limit's are
// codes.Unavailable with RetryInfo; a request the rules cannot count is
// codes.InvalidArgument. The RateLimit fields go as response metadata
// (ratelimit, ratelimit-policy, retry-after), as headers, which grpc-go's
// clients read with grpc.Header (and, for a refusal, with grpc.Trailer).
//
// Only this package imports grpc-go: the engine and the stores do not.
package grpclimit
