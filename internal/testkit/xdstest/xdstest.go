// Package xdstest runs a real xDS management server for tests, built from
// go-control-plane's server and snapshot cache as a control plane (Envoy
// Gateway's, for one) is: it serves RateLimitConfig resources over ADS
// and records every request its clients send (the ACKs and NACKs).
package xdstest

import (
	"context"
	"net"
	"sync"
	"testing"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	xdsserver "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
)

// Server is a management server on a loopback port.
type Server struct {
	Addr  string
	cache cache.SnapshotCache
	grpc  *grpc.Server
	mu    sync.Mutex
	reqs  []*discovery.DiscoveryRequest
}

// Start serves on addr ("127.0.0.1:0" for any free port) until Stop or the
// test's end; the cache is new, holding no snapshot.
func Start(t testing.TB, addr string) *Server {
	t.Helper()
	return StartWith(t, addr, cache.NewSnapshotCache(false, cache.IDHash{}, nil))
}

// StartWith serves c, so that a restarted server can hold what the last
// one did (or not).
func StartWith(t testing.TB, addr string, c cache.SnapshotCache) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Addr: ln.Addr().String(), cache: c, grpc: grpc.NewServer()}
	cb := xdsserver.CallbackFuncs{StreamRequestFunc: func(_ int64, r *discovery.DiscoveryRequest) error {
		s.mu.Lock()
		s.reqs = append(s.reqs, r)
		s.mu.Unlock()
		return nil
	}}
	discovery.RegisterAggregatedDiscoveryServiceServer(s.grpc, xdsserver.NewServer(context.Background(), c, cb))
	go s.grpc.Serve(ln)
	t.Cleanup(s.Stop)
	return s
}

// Cache is the server's snapshot cache.
func (s *Server) Cache() cache.SnapshotCache { return s.cache }

// Set makes configs, at version, the state of the world for node.
func (s *Server) Set(t testing.TB, node, version string, configs ...*rlsconf.RateLimitConfig) {
	t.Helper()
	rs := make([]types.Resource, len(configs))
	for i, c := range configs {
		rs[i] = c
	}
	snap, err := cache.NewSnapshot(version, map[resource.Type][]types.Resource{resource.RateLimitConfigType: rs})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cache.SetSnapshot(context.Background(), node, snap); err != nil {
		t.Fatal(err)
	}
}

// Requests are the discovery requests received so far, in order.
func (s *Server) Requests() []*discovery.DiscoveryRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*discovery.DiscoveryRequest(nil), s.reqs...)
}

// Stop ends the server and its streams at once.
func (s *Server) Stop() { s.grpc.Stop() }

// Limit is a RateLimitConfig of one domain with one descriptor key: value
// limited to n per unit (a convenience for tests).
func Limit(name, domain, key, value string, n uint32, unit rlsconf.RateLimitUnit) *rlsconf.RateLimitConfig {
	return &rlsconf.RateLimitConfig{Name: name, Domain: domain, Descriptors: []*rlsconf.RateLimitDescriptor{{
		Key: key, Value: value, RateLimit: &rlsconf.RateLimitPolicy{Unit: unit, RequestsPerUnit: n},
	}}}
}
