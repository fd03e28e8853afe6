package envoy

import (
	"context"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// envoyClient serves the example envoyproxy/ratelimit file on a loopback
// port and returns go-control-plane's generated client for it.
func envoyClient(t *testing.T) rlsv3.RateLimitServiceClient {
	t.Helper()
	cfg, err := rules.Load("../examples/envoy/ratelimit-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	e, _ := engine.New(cfg, engine.Options{Store: memory.New(), Logger: quiet})
	s, _ := New(Options{Engine: e, Logger: quiet})
	g := s.newGRPCGo()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func descriptor(kv ...string) *ratelimitcommonv3.RateLimitDescriptor {
	d := &ratelimitcommonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitcommonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func TestEnvoyShouldRateLimit(t *testing.T) {
	c := envoyClient(t)
	ctx := context.Background()
	login := descriptor("api_key", "k1", "path", "/login")
	other := descriptor("remote_address", "203.0.113.7")
	for i := range 6 {
		resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{other, login}})
		if err != nil {
			t.Fatal(err)
		}
		want := rlsv3.RateLimitResponse_OK
		if i == 5 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if resp.OverallCode != want || len(resp.Statuses) != 2 || resp.Statuses[1].Code != want || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d: %v", i+1, resp)
		}
		if cl := resp.Statuses[1].CurrentLimit; cl.Name != "login" || cl.RequestsPerUnit != 5 || cl.Unit != rlsv3.RateLimitResponse_RateLimit_MINUTE {
			t.Fatalf("current limit %v", cl)
		}
		if i == 5 {
			headers := map[string]string{}
			for _, h := range resp.ResponseHeadersToAdd {
				headers[h.Key] = h.Value
			}
			if headers["Retry-After"] == "" || headers["RateLimit"] == "" || headers["RateLimit-Policy"] == "" {
				t.Fatalf("headers to add: %v", headers)
			}
		}
	}
	// Request-level hits_addend, negative hits and an override.
	resp, _ := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 50,
		Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{descriptor("remote_address", "198.51.100.1")}})
	if resp.Statuses[0].LimitRemaining != 10 {
		t.Fatalf("hits_addend 50 of 60: %v", resp.Statuses[0])
	}
	neg := descriptor("remote_address", "198.51.100.1")
	neg.IsNegativeHits, neg.HitsAddend = true, wrapperspb.UInt64(20)
	resp, _ = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{neg}})
	if resp.Statuses[0].LimitRemaining != 30 {
		t.Fatalf("20 negative hits: %v", resp.Statuses[0])
	}
	ov := descriptor("anything", "x")
	ov.Limit = &ratelimitcommonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{ov}})
	resp, _ = c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{ov}})
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].CurrentLimit.Unit != rlsv3.RateLimitResponse_RateLimit_HOUR {
		t.Fatalf("override 1 per hour, second request: %v", resp)
	}
	// Bad requests are InvalidArgument.
	for _, bad := range []*rlsv3.RateLimitRequest{
		{Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{other}},
		{Domain: "edge"},
		{Domain: "edge", Descriptors: []*ratelimitcommonv3.RateLimitDescriptor{{}}},
	} {
		if _, err := c.ShouldRateLimit(ctx, bad); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v", bad, err)
		}
	}
}

func TestUnitOfWritesPeriodsInEnvoysTerms(t *testing.T) {
	for d, want := range map[time.Duration]struct {
		unit rlsv3.RateLimitResponse_RateLimit_Unit
		mult int64
	}{
		time.Second:            {rlsv3.RateLimitResponse_RateLimit_SECOND, 1},
		15 * time.Minute:       {rlsv3.RateLimitResponse_RateLimit_MINUTE, 15},
		2 * time.Hour:          {rlsv3.RateLimitResponse_RateLimit_HOUR, 2},
		7 * 24 * time.Hour:     {rlsv3.RateLimitResponse_RateLimit_WEEK, 1},
		500 * time.Millisecond: {rlsv3.RateLimitResponse_RateLimit_SECOND, 1},
		90 * time.Second:       {rlsv3.RateLimitResponse_RateLimit_SECOND, 90},
	} {
		if u, m := unitOf(d); u != want.unit || m != want.mult {
			t.Errorf("unitOf(%v) = %v x %d, want %v x %d", d, u, m, want.unit, want.mult)
		}
	}
}
