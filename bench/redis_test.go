package bench

import (
	"bufio"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"
	"github.com/sluice-rl/sluice"
	sredis "github.com/sluice-rl/sluice/store/redis"
	"github.com/sluice-rl/sluice/store/redis/redistest"
	ulule "github.com/ulule/limiter/v3"
	ululeredis "github.com/ulule/limiter/v3/drivers/store/redis"
)

// redisContender makes one decision against Redis for a key.
type redisContender struct {
	name string
	make func(b *testing.B, url, addr string) (func(ctx context.Context, key string) error, func())
}

var redisLimit = sluice.Limit{Rate: 1000, Period: time.Second, Burst: 1000}

func redisContenders() []redisContender {
	sluiceWith := func(a sluice.Algorithm, rules int) func(*testing.B, string, string) (func(context.Context, string) error, func()) {
		return func(b *testing.B, url, _ string) (func(context.Context, string) error, func()) {
			s, err := sredis.New(sredis.Options{URL: url})
			if err != nil {
				b.Fatal(err)
			}
			l := redisLimit
			l.Algorithm = a
			if !a.IsBucket() {
				l.Burst = 0
			}
			names := []string{"per-user", "per-user-minute", "per-user-hour"}[:rules]
			return func(ctx context.Context, key string) error {
				var takes [3]sluice.Take
				var out [3]sluice.Decision
				for i, r := range names {
					takes[i] = sluice.Take{Rule: r, Key: key, Limit: l, Cost: 1}
				}
				return s.Take(ctx, takes[:rules], out[:rules])
			}, s.Close
		}
	}
	return []redisContender{
		{"sluice-gcra", sluiceWith(sluice.GCRA, 1)},
		{"sluice-token-bucket", sluiceWith(sluice.TokenBucket, 1)},
		{"sluice-sliding-log", sluiceWith(sluice.SlidingLog, 1)},
		{"sluice-3-rules", sluiceWith(sluice.GCRA, 3)},
		{"redis_rate", func(b *testing.B, _, addr string) (func(context.Context, string) error, func()) {
			rdb := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: 128})
			lim := redis_rate.NewLimiter(rdb)
			l := redis_rate.Limit{Rate: 1000, Burst: 1000, Period: time.Second}
			return func(ctx context.Context, key string) error {
				_, err := lim.Allow(ctx, key, l)
				return err
			}, func() { rdb.Close() }
		}},
		{"ulule", func(b *testing.B, _, addr string) (func(context.Context, string) error, func()) {
			rdb := goredis.NewClient(&goredis.Options{Addr: addr, PoolSize: 128})
			st, err := ululeredis.NewStore(rdb)
			if err != nil {
				b.Fatal(err)
			}
			lim := ulule.New(st, ulule.Rate{Period: time.Second, Limit: 1000})
			return func(ctx context.Context, key string) error {
				_, err := lim.Get(ctx, key)
				return err
			}, func() { rdb.Close() }
		}},
	}
}

// BenchmarkRedis runs every contender against the same redis-server on
// loopback, at 1, 8 and 64 concurrent callers over 10,000 keys, and reports
// decisions per second, p50 and p99 latency, and Redis commands per decision
// (from INFO commandstats).
func BenchmarkRedis(b *testing.B) {
	srv := redistest.Start(b)
	for _, c := range redisContenders() {
		for _, callers := range []int{1, 8, 64} {
			b.Run(fmt.Sprintf("%s/callers=%d", c.name, callers), func(b *testing.B) {
				decide, done := c.make(b, srv.URL(), srv.Addr)
				defer done()
				ctx := context.Background()
				if err := decide(ctx, "warm"); err != nil { // loads scripts, opens connections
					b.Fatal(err)
				}
				before := commandCalls(b, srv)
				var next atomic.Int64
				lat := make([][]time.Duration, callers)
				var wg sync.WaitGroup
				b.ResetTimer()
				for g := range callers {
					wg.Go(func() {
						for {
							i := next.Add(1)
							if i > int64(b.N) {
								return
							}
							start := time.Now()
							if err := decide(ctx, "user:"+strconv.FormatInt(i%10000, 10)); err != nil {
								b.Error(err)
								return
							}
							lat[g] = append(lat[g], time.Since(start))
						}
					})
				}
				wg.Wait()
				b.StopTimer()
				all := slices.Concat(lat...)
				slices.Sort(all)
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
				if len(all) > 0 {
					b.ReportMetric(float64(all[len(all)/2].Microseconds()), "p50-µs")
					b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "p99-µs")
				}
				// INFO itself is one command: leave it out.
				b.ReportMetric(float64(commandCalls(b, srv)-before-1)/float64(b.N), "cmds/decision")
			})
		}
	}
}

// commandCalls sums the calls of every command in INFO commandstats.
func commandCalls(b *testing.B, srv *redistest.Server) int64 {
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer rdb.Close()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total int64
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		_, stats, _ := strings.Cut(line, ":")
		for _, kv := range strings.Split(stats, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				total += n
			}
		}
	}
	return total
}
