package bench

import (
	"context"
	"sync"
	"time"

	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/memory"
	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/memstore"
	ulule "github.com/ulule/limiter/v3"
	ululemem "github.com/ulule/limiter/v3/drivers/store/memory"
	"golang.org/x/time/rate"
)

// keyed is the one operation every limiter under test shares: take one unit
// from key's limit, report whether it was admitted.
type keyed interface {
	Allow(key string) bool
}

// limit is the per-key limit every contender enforces: rate per period, with
// a burst of rate.
type limit struct {
	rate   int
	period time.Duration
}

// busy is the limit of the speed benchmarks: 100 per second, burst 100.
// lasting is the limit of the memory benchmark: 1 per hour, so every key
// inserted stays live (not back to idle) until it is measured.
var (
	busy    = limit{100, time.Second}
	lasting = limit{1, time.Hour}
)

type contender struct {
	name string
	// make builds the limiter for a run of about keys keys; the closer
	// releases background goroutines.
	make func(keys int, l limit) (keyed, func())
}

func contenders() []contender {
	return []contender{
		{"sluice-gcra", func(keys int, l limit) (keyed, func()) { return newSluice(keys, l, sluice.GCRA, nil) }},
		{"sluice-gcra-coarse", func(keys int, l limit) (keyed, func()) {
			c := sluice.NewCoarseClock(time.Millisecond)
			k, done := newSluice(keys, l, sluice.GCRA, c)
			return k, func() { done(); c.Stop() }
		}},
		{"sluice-token-bucket", func(keys int, l limit) (keyed, func()) { return newSluice(keys, l, sluice.TokenBucket, nil) }},
		{"x-time-rate", func(_ int, l limit) (keyed, func()) { return newXrate(l), func() {} }},
		{"throttled", func(_ int, l limit) (keyed, func()) { return newThrottled(l), func() {} }},
		{"ulule", func(_ int, l limit) (keyed, func()) { return newUlule(l), func() {} }},
		{"sethvargo", func(_ int, l limit) (keyed, func()) { return newSethvargo(l) }},
	}
}

func newSluice(keys int, lim limit, a sluice.Algorithm, clock sluice.Clock) (keyed, func()) {
	opts := []memory.Option{memory.WithMaxKeys(max(keys*2, memory.DefaultMaxKeys))}
	if clock != nil {
		opts = append(opts, memory.WithClock(clock))
	}
	s := memory.New(opts...)
	l, err := s.Limiter("bench", sluice.Limit{Rate: int64(lim.rate), Period: lim.period, Algorithm: a})
	if err != nil {
		panic(err)
	}
	return l, func() {}
}

// xrate is the usual pattern around golang.org/x/time/rate: a map of
// limiters under a mutex.
type xrate struct {
	mu    sync.Mutex
	m     map[string]*rate.Limiter
	every rate.Limit
	burst int
}

func newXrate(l limit) *xrate {
	return &xrate{m: map[string]*rate.Limiter{}, every: rate.Every(l.period / time.Duration(l.rate)), burst: l.rate}
}

func (x *xrate) Allow(key string) bool {
	x.mu.Lock()
	l, ok := x.m[key]
	if !ok {
		l = rate.NewLimiter(x.every, x.burst)
		x.m[key] = l
	}
	x.mu.Unlock()
	return l.Allow()
}

type throttledLimiter struct{ l *throttled.GCRARateLimiterCtx }

func newThrottled(lim limit) keyed {
	st, err := memstore.NewCtx(0) // 0: a plain map, its fastest store
	if err != nil {
		panic(err)
	}
	l, err := throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{MaxRate: throttled.PerDuration(lim.rate, lim.period), MaxBurst: lim.rate - 1})
	if err != nil {
		panic(err)
	}
	return &throttledLimiter{l}
}

func (t *throttledLimiter) Allow(key string) bool {
	limited, _, err := t.l.RateLimitCtx(context.Background(), key, 1)
	return err == nil && !limited
}

type ululeLimiter struct{ l *ulule.Limiter }

func newUlule(l limit) keyed {
	return &ululeLimiter{ulule.New(ululemem.NewStore(), ulule.Rate{Period: l.period, Limit: int64(l.rate)})}
}

func (u *ululeLimiter) Allow(key string) bool {
	c, err := u.l.Get(context.Background(), key)
	return err == nil && !c.Reached
}

type sethvargoLimiter struct {
	s interface {
		Take(context.Context, string) (uint64, uint64, uint64, bool, error)
	}
}

func newSethvargo(l limit) (keyed, func()) {
	s, err := memorystore.New(&memorystore.Config{Tokens: uint64(l.rate), Interval: l.period})
	if err != nil {
		panic(err)
	}
	return &sethvargoLimiter{s}, func() { s.Close(context.Background()) }
}

func (s *sethvargoLimiter) Allow(key string) bool {
	_, _, _, ok, err := s.s.Take(context.Background(), key)
	return err == nil && ok
}
