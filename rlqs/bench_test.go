package rlqs

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
	"google.golang.org/protobuf/types/known/durationpb"
)

// BenchmarkReport is the cost of one usage report, from its message to the
// assignments left for the streams (no transport): the bucket divided again
// and the reporter's grant renewed or replaced, paid in the embedded store.
// The clock moves 100 ms a report, so that every report is answered.
func BenchmarkReport(b *testing.B) {
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) {
			cfg, err := rules.Parse("quota.yaml", []byte(sharedRule))
			if err != nil {
				b.Fatal(err)
			}
			clock := sluice.NewManualClock(time.Unix(1_800_000_000, 0))
			e, _ := engine.New(cfg, engine.Options{Store: memory.New(memory.WithClock(clock)), Logger: quiet})
			svc, _ := New(Options{Engine: e, Clock: clock, Logger: quiet})
			ctx := context.Background()
			clients := make([]*client, n)
			msgs := make([]*rlqsv3.RateLimitQuotaUsageReports, n)
			for i := range clients {
				clients[i] = newClient(svc)
				msgs[i] = &rlqsv3.RateLimitQuotaUsageReports{Domain: "quota", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
					BucketId:           &rlqsv3.BucketId{Bucket: map[string]string{"name": "shared"}},
					TimeElapsed:        durationpb.New(time.Second),
					NumRequestsAllowed: uint64(1 + i%7),
				}}}
				if err := clients[i].report(ctx, msgs[i]); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				clock.Advance(100 * time.Millisecond)
				if err := clients[i%n].report(ctx, msgs[i%n]); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
