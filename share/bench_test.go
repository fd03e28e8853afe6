package share

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	globalpkg "github.com/sluice-rl/sluice/global"
	"github.com/sluice-rl/sluice/store/memory"
	"github.com/sluice-rl/sluice/store/redis"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// A fleet of 3 gateways, each its own Store and Redis client, on one real
// redis-server: decisions/s and store calls per decision on one hot key
// with headroom (the key never runs out), exact against lease.
//
//	go test ./share -run '^$' -bench Fleet -benchtime 3s -count 6
func BenchmarkFleetOnOneRedis(b *testing.B) {
	url := redistest.Start(b).URL()
	for _, mode := range []sluice.SyncMode{sluice.SyncExact, sluice.SyncLease} {
		b.Run(mode.String(), func(b *testing.B) {
			var gws []*Store
			for i := range 3 {
				rs, err := redis.New(redis.Options{URL: url, Prefix: fmt.Sprintf("bench%d:", time.Now().UnixNano())})
				if err != nil {
					b.Fatal(err)
				}
				defer rs.Close()
				g := New(rs, Options{Local: memory.New(), Gateways: func() int { return 3 },
					Sharing: func(string) sluice.Sharing { return sluice.Sharing{Mode: mode, Batch: 50} }})
				defer g.Close()
				gws = append(gws, g)
				_ = i
			}
			lim := sluice.Limit{Rate: 1 << 40, Period: time.Hour}
			var next atomic.Uint64
			b.SetParallelism(32) // 64 callers on 2 cores
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				g := gws[next.Add(1)%3]
				takes := []sluice.Take{{Rule: "r", Key: "hot", Limit: lim, Cost: 1}}
				out := make([]sluice.Decision, 1)
				for pb.Next() {
					if err := g.Take(context.Background(), takes, out); err != nil || !out[0].Allowed {
						b.Fatalf("take: %v %+v", err, out[0])
					}
				}
			})
			b.StopTimer()
			var calls uint64
			for _, g := range gws {
				calls += g.Stats().RemoteCalls
			}
			b.ReportMetric(float64(calls)/float64(b.N), "calls/decision")
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
		})
	}
}

// A decision of a global rule against one of an exact rule, on the
// embedded store, 64 callers on one hot key and on many keys: what the
// region's part (Limit.Portion) costs a decision, and what counting its
// demand (global.Demand) adds.
//
//	go test ./share -run '^$' -bench GlobalTake -benchmem -count 6
func BenchmarkGlobalTake(b *testing.B) {
	for _, keys := range []int{1, 10_000} {
		for _, kind := range []string{"exact", "portion", "portion+demand"} {
			o := Options{Local: memory.New(), NoDenyCache: true}
			if kind != "exact" {
				o.Portion = func(string) int64 { return 400 }
			}
			if kind == "portion+demand" {
				o.Demand = globalpkg.NewDemand(0)
			}
			b.Run(fmt.Sprintf("keys=%d/%s", keys, kind), func(b *testing.B) {
				s := New(memory.New(), o)
				defer s.Close()
				lim := sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 1 << 40, Period: time.Hour}
				names := make([]string, keys)
				for i := range names {
					names[i] = fmt.Sprintf("user-%d", i)
				}
				var next atomic.Uint64
				b.SetParallelism(32) // 64 callers on 2 cores
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					i := next.Add(1) * 7919
					takes := []sluice.Take{{Rule: "r", Limit: lim, Cost: 1}}
					out := make([]sluice.Decision, 1)
					for pb.Next() {
						i++
						takes[0].Key = names[i%uint64(keys)]
						if err := s.Take(context.Background(), takes, out); err != nil || !out[0].Allowed {
							b.Fatalf("take: %v %+v", err, out[0])
						}
					}
				})
			})
		}
	}
}
