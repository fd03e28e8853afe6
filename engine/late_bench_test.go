package engine

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/redis"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// What following late replies costs a check on a real Redis: each call runs
// in a goroutine of its own (graced) or in the caller's (the grace off), 64
// callers on 2 cores, 10,000 keys.
//
//	go test ./engine -run '^$' -bench CheckOnRedis -count 6 | benchstat -col /calls -
func BenchmarkCheckOnRedis(b *testing.B) {
	srv := redistest.Start(b)
	cfg, err := rules.Parse("bench.yaml", []byte("rules:\n  - {id: r, key: [user], rate: 1000000000, per: 1s}\n"))
	if err != nil {
		b.Fatal(err)
	}
	for _, graced := range []bool{true, false} {
		name := "calls=graced"
		if !graced {
			name = "calls=direct"
		}
		b.Run(name, func(b *testing.B) {
			s, err := redis.New(redis.Options{URL: srv.URL()})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			o := Options{Store: s}
			if !graced {
				o.Calls.LateGrace = -1
			}
			e, err := New(cfg, o)
			if err != nil {
				b.Fatal(err)
			}
			var failed atomic.Int64
			b.SetParallelism(32)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				var res Result
				users := [...]string{"a", "b", "c", "d", "e", "f", "g", "h"}
				req := userReq("")
				i := 0
				for pb.Next() {
					i++
					req.Header.Set("X-User-Id", users[i%len(users)]+string(rune('a'+i%26)))
					if err := e.Check(context.Background(), req, CheckOptions{}, &res); err != nil {
						b.Error(err)
						return
					}
					if res.StoreError != nil {
						failed.Add(1)
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
			b.ReportMetric(float64(failed.Load()), "failed-calls")
		})
	}
}
