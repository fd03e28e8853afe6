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

// The common limit: 100 per second with a burst of 100, per key.
const (
	perSecond = 100
	burst     = 100
)

type contender struct {
	name string
	// make builds the limiter for a run of about keys keys; the closer
	// releases background goroutines.
	make func(keys int) (keyed, func())
}

func contenders() []contender {
	return []contender{
		{"sluice-gcra", func(keys int) (keyed, func()) { return newSluice(keys, sluice.GCRA, nil) }},
		{"sluice-gcra-coarse", func(keys int) (keyed, func()) {
			c := sluice.NewCoarseClock(time.Millisecond)
			k, done := newSluice(keys, sluice.GCRA, c)
			return k, func() { done(); c.Stop() }
		}},
		{"sluice-token-bucket", func(keys int) (keyed, func()) { return newSluice(keys, sluice.TokenBucket, nil) }},
		{"x-time-rate", func(int) (keyed, func()) { return &xrate{m: map[string]*rate.Limiter{}}, func() {} }},
		{"throttled", func(int) (keyed, func()) { return newThrottled(), func() {} }},
		{"ulule", func(int) (keyed, func()) { return newUlule(), func() {} }},
		{"sethvargo", func(int) (keyed, func()) { return newSethvargo() }},
	}
}

func newSluice(keys int, a sluice.Algorithm, clock sluice.Clock) (keyed, func()) {
	opts := []memory.Option{memory.WithMaxKeys(max(keys*2, memory.DefaultMaxKeys))}
	if clock != nil {
		opts = append(opts, memory.WithClock(clock))
	}
	s := memory.New(opts...)
	l, err := s.Limiter("bench", sluice.Limit{Rate: perSecond, Period: time.Second, Burst: burst, Algorithm: a})
	if err != nil {
		panic(err)
	}
	return l, func() {}
}

// xrate is the usual pattern around golang.org/x/time/rate: a map of
// limiters under a mutex.
type xrate struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func (x *xrate) Allow(key string) bool {
	x.mu.Lock()
	l, ok := x.m[key]
	if !ok {
		l = rate.NewLimiter(perSecond, burst)
		x.m[key] = l
	}
	x.mu.Unlock()
	return l.Allow()
}

type throttledLimiter struct{ l *throttled.GCRARateLimiterCtx }

func newThrottled() keyed {
	st, err := memstore.NewCtx(0) // 0: a plain map, its fastest store
	if err != nil {
		panic(err)
	}
	l, err := throttled.NewGCRARateLimiterCtx(st, throttled.RateQuota{MaxRate: throttled.PerSec(perSecond), MaxBurst: burst - 1})
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

func newUlule() keyed {
	return &ululeLimiter{ulule.New(ululemem.NewStore(), ulule.Rate{Period: time.Second, Limit: perSecond})}
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

func newSethvargo() (keyed, func()) {
	s, err := memorystore.New(&memorystore.Config{Tokens: burst, Interval: time.Second})
	if err != nil {
		panic(err)
	}
	return &sethvargoLimiter{s}, func() { s.Close(context.Background()) }
}

func (s *sethvargoLimiter) Allow(key string) bool {
	_, _, _, ok, err := s.s.Take(context.Background(), key)
	return err == nil && ok
}
