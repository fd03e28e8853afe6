package redis

import (
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
)

// The cache answers what paramsOf and fingerprint would, stops growing at
// its bound (limits from requests are the attacker's to choose), and keeps
// answering correctly past it.
func TestLimitCacheIsExactAndBounded(t *testing.T) {
	var c limitCache
	check := func(l sluice.Limit) {
		t.Helper()
		li, err := c.info(l)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := paramsOf(l)
		want := [5]string{itoa(p.t), itoa(p.d), itoa(p.w), itoa(p.l), itoa(p.own)}
		if li.params != p || li.fp != fingerprint(l) || li.args != want {
			t.Fatalf("%v: cached %+v, want %+v %s %v", l, li, p, fingerprint(l), want)
		}
	}
	algs := []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.FixedWindow, sluice.SlidingWindow, sluice.SlidingLog}
	for i := range 3 * maxCachedLimits {
		l := sluice.Limit{Rate: int64(1 + i), Period: time.Minute, Algorithm: algs[i%len(algs)]}
		if l.Algorithm == sluice.GCRA || l.Algorithm == sluice.TokenBucket {
			l.Burst = int64(1 + i%7)
		}
		check(l)
		check(l) // and again, from the cache while there is room
	}
	if n := len(*c.m.Load()); n != maxCachedLimits {
		t.Fatalf("%d limits cached, want the bound %d", n, maxCachedLimits)
	}
	// An invalid limit is refused every time and never cached.
	bad := sluice.Limit{Rate: 1, Period: 200 * 365 * 24 * time.Hour}
	for range 2 {
		if _, err := c.info(bad); err == nil {
			t.Fatalf("%v accepted", bad)
		}
	}
	if _, ok := (*c.m.Load())[bad]; ok {
		t.Fatal("an invalid limit was cached")
	}
}
