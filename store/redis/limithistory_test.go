package redis_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
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
	before := time.Now().Add(-time.Millisecond) // the note's time is Redis's, in ms
	if err := a.LimitHistory().Note(ctx, map[string][]sluice.Limit{"per-user": {three, six}, "quota": {month}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	future := strconv.FormatInt(time.Now().Add(10*365*24*time.Hour).UnixMilli(), 10)
	srv.Do("HSET", "h:{sluice-limits}", "per-user\x00not,a,limit", "1", "junk", "x", "per-user\x00"+"0,0,0,0,0,0", "1",
		"per-user\x00"+"9,1000000000,0,0,0,0", future)
	got, err := b.LimitHistory().Recent(ctx)
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now() // the read: its times are Redis's, whole ms, moved to this clock
	noted := func(at time.Time) bool { return !at.Before(before) && !at.After(after) }
	if len(got) != 2 || len(got["per-user"]) != 2 || !noted(got["per-user"][three]) || !noted(got["per-user"][six]) || !noted(got["quota"][month]) {
		t.Fatalf("read %v, want per-user's two limits and quota's, noted between %v and %v (junk and a limit dated ahead passed over)", got, before, after)
	}
}

// A record filled past its bound with junk, or with limits dated ahead,
// keeps the limits the processes note: the junk goes first.
func TestTheLimitHistoryOutlivesJunk(t *testing.T) {
	srv := redistest.Start(t)
	s, err := redis.New(redis.Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	args := []string{"HSET", "{sluice-limits}"}
	future := strconv.FormatInt(time.Now().Add(10*365*24*time.Hour).UnixMilli(), 10)
	for i := range 12_000 {
		if i%2 == 0 {
			args = append(args, fmt.Sprint("junk", i), "x")
		} else {
			args = append(args, fmt.Sprintf("per-user\x00%d,600000000000,0,0,0,0", i), future)
		}
	}
	if _, err := srv.Do(args...); err != nil {
		t.Fatal(err)
	}
	l := sluice.Limit{Rate: 3, Period: 10 * time.Minute}
	if err := s.LimitHistory().Note(context.Background(), map[string][]sluice.Limit{"per-user": {l}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	got, err := s.LimitHistory().Recent(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got["per-user"]) != 1 || got["per-user"][l].IsZero() {
		t.Fatalf("after 12,000 fields of junk and limits dated ahead: %d limits of per-user read, want the one noted", len(got["per-user"]))
	}
	if n, _ := srv.Do("HLEN", "{sluice-limits}"); strings.TrimPrefix(n, ":") != "1" {
		t.Fatalf("the record holds %s fields, want the junk gone", n)
	}
}
