// Package xds takes the service's Envoy rules from an xDS management server
// instead of files, as Envoy Gateway configures envoyproxy/ratelimit: a
// state-of-the-world subscription, over the aggregated discovery service
// (ADS), to resources of type
// type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig.
//
// Each response is the whole configuration (state of the world): every
// RateLimitConfig it holds is read as an envoyproxy/ratelimit file of that
// domain, with the same validation as a file (rules.Parse), and the files
// are merged as several --config files are (one domain per resource unless
// MergeDomains). A response that does not load is NACKed, with the fault in
// the request's error_detail, and the rules being served stay. One that
// loads is applied whole, in one step (Client.Apply, an engine reload), and
// ACKed with its version_info.
//
// When the stream ends (the management server restarts or goes away) the
// last configuration applied keeps serving and the client connects again
// after a backoff: Backoff.Initial doubled after each failed attempt up to
// Backoff.Max, each wait multiplied by a random factor in [1-f, 1+f]
// (f = Backoff.RandomFactor) when Backoff.Jitter is set, so that a fleet
// of services does not reconnect in step. A stream that delivered a
// response resets the backoff. A new stream sends the version last applied,
// so a server that still holds it need not send it again.
package xds
