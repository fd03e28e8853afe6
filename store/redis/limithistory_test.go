package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/redis"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// The limits each rule is counted under, noted by one process, are read by
// another with when they were last noted; a field that is not a limit is
// passed over, never trusted.
func TestTheLimitHistoryIsSharedByTheProcesses(t *testing.T) {
	srv := redistest.Start(t)
	a, err := redis.New(redis.Options{URL: srv.URL(), Prefix: "h:"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := redis.New(redis.Options{URL: srv.URL(), Prefix: "h:"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx := context.Background()
	three := sluice.Limit{Rate: 3, Period: 10 * time.Minute}
	six := sluice.Limit{Rate: 6, Period: time.Hour, Burst: 9, Algorithm: sluice.TokenBucket}
	month := sluice.Limit{Rate: 1000, Period: sluice.CalendarMonth, Algorithm: sluice.FixedWindow, Calendar: true}
	at := time.UnixMilli(time.Now().UnixMilli())
	if err := a.LimitHistory().Note(ctx, map[string][]sluice.Limit{"per-user": {three, six}, "quota": {month}}, at); err != nil {
		t.Fatal(err)
	}
	srv.Do("HSET", "h:{sluice-limits}", "per-user\x00not,a,limit", "1", "junk", "x", "per-user\x00"+"0,0,0,0,0,0", "1")
	got, err := b.LimitHistory().Recent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || len(got["per-user"]) != 2 || !got["per-user"][three].Equal(at) || !got["per-user"][six].Equal(at) || !got["quota"][month].Equal(at) {
		t.Fatalf("read %v, want per-user's two limits and quota's, noted at %v", got, at)
	}
}
