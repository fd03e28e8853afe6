package envoy

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	ratelimitcommonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
	"google.golang.org/protobuf/proto"
)

// The h2grpc server's answers reuse their messages from call to call; they
// must encode exactly what grpc-go's fresh ones do. Two services on the same
// rules and the same manual clock get the same requests, in an order that
// makes a reused message meet a different shape: more descriptors, then
// fewer, limited and unknown ones, overrides with a unit multiplier, refusals
// with headers, then none.
func TestEnvoyAnswersOnTheWireMatchFreshOnes(t *testing.T) {
	cfg, err := rules.Load("../examples/envoy/ratelimit-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	clock := sluice.NewManualClock(time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC))
	service := func() *Service {
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		e, err := engine.New(cfg, engine.Options{Store: memory.New(memory.WithClock(clock)), Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		s, err := New(Options{Engine: e, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	fresh, wire := service(), service()

	login := descriptor("api_key", "k1", "path", "/login")
	other := descriptor("remote_address", "203.0.113.7")
	unknown := descriptor("nothing", "here")
	internal := descriptor("source", "internal")
	twoMinutes := descriptor("anything", "y")
	twoMinutes.Limit = &ratelimitcommonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE}
	shapes := [][]*ratelimitcommonv3.RateLimitDescriptor{
		{other, login, unknown, internal},
		{login},
		{unknown},
		{twoMinutes, other},
		{internal},
		{login, twoMinutes},
	}
	ctx := context.Background()
	refused := 0
	for i := range 60 {
		req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: shapes[i%len(shapes)]}
		want, err := fresh.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		in, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		out, err := wire.call(ctx, in, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := new(rlsv3.RateLimitResponse)
		if err := proto.Unmarshal(out, got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("call %d:\n on the wire %v\n fresh       %v", i, got, want)
		}
		if want.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			refused++
		}
		clock.Advance(time.Second)
	}
	if refused == 0 {
		t.Fatal("no call was refused: the answers compared never carried a refusal's headers")
	}
}
