// Package envoy is sluice as Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit), the
// service Envoy, Istio and Envoy Gateway call from their rate limit filter,
// with the standard gRPC health check.
//
// One Service (New) over one engine decides a request's descriptors
// (envoy.go, Service.decide → engine.Engine.CheckDescriptors) and answers
// as envoyproxy/ratelimit does: a status per descriptor, OVER_LIMIT overall
// if any is over, the RateLimit fields to add. Service.NewGRPC serves it on
// either gRPC server, by name (GRPCServerKinds): "sluice", sluice's own
// unary HTTP/2 server (internal/h2grpc, the default, about half grpc-go's
// CPU per call; answers encoded from reused messages, answer.go), or
// "grpc-go". One contract suite (grpc_contract_test.go) holds both to the
// same bounds against hostile clients. Package envoy/xds takes the rules
// themselves from an xDS management server, as Envoy Gateway configures
// them. docs/service.md is the reference.
package envoy
