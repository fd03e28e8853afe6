package redis_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/overrides"
	"github.com/sluice-rl/sluice/store/redis"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

func TestOverridesSingleNode(t *testing.T) { overridesOn(t, redistest.Start(t).URL()) }
func TestOverridesCluster(t *testing.T)    { overridesOn(t, redistest.StartCluster(t).URL()) }

// overridesOn: compare-and-set, expiry without a timer, and two followers
// (two processes' views) told of a change made through either.
func overridesOn(t *testing.T, url string) {
	ctx := context.Background()
	prefix := fmt.Sprintf("ov%d:", time.Now().UnixNano())
	open := func() *redis.Overrides {
		s, err := redis.New(redis.Options{URL: url, Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s.Overrides()
	}
	a, b := open(), open()
	fa, fb := &overrides.Follower{Store: a, Reread: time.Hour}, &overrides.Follower{Store: b, Reread: time.Hour}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go fa.Run(runCtx)
	go fb.Run(runCtx)
	for deadline := time.Now().Add(10 * time.Second); fa.Current() == nil || fb.Current() == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the followers never read the store")
		}
	}
	time.Sleep(200 * time.Millisecond) // their subscriptions are made

	now := time.Now()
	o := overrides.Override{Rule: "r", Key: "k", Action: overrides.Limit, Rate: 200, Per: overrides.Duration(time.Minute),
		Expires: now.Add(time.Hour), Reason: "launch", By: "ops"}
	w, before, err := a.Put(ctx, o, 0, now)
	if err != nil || before != nil || w.Version < 1 {
		t.Fatalf("create: %+v %+v %v", w, before, err)
	}
	seen := func(f *overrides.Follower, want func(*overrides.Override) bool) time.Duration {
		t.Helper()
		start := time.Now()
		for deadline := start.Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			if want(f.Current().Find("r", "k", time.Now())) {
				return time.Since(start)
			}
			if time.Now().After(deadline) {
				t.Fatal("a follower did not see the change in 10 s (its re-read is an hour away: the notification was lost)")
			}
		}
	}
	d := seen(fb, func(x *overrides.Override) bool { return x != nil && x.Rate == 200 })
	t.Logf("the other process's follower saw the change %v after it was made", d)

	if _, _, err := b.Put(ctx, o, 0, now); !errors.Is(err, overrides.ErrVersion) {
		t.Fatalf("a second create: %v, want ErrVersion", err)
	}
	absent := o
	absent.Key = "absent"
	if _, _, err := b.Put(ctx, absent, overrides.Existing, now); !errors.Is(err, overrides.ErrVersion) {
		t.Fatalf("a replace of any version where none exists: %v, want ErrVersion", err)
	}
	o.Rate = 300
	if _, _, err := b.Put(ctx, o, w.Version+1, now); !errors.Is(err, overrides.ErrVersion) {
		t.Fatalf("a replace at a wrong version: %v, want ErrVersion", err)
	}
	w2, before, err := b.Put(ctx, o, w.Version, now)
	if err != nil || before == nil || before.Rate != 200 || before.Reason != "launch" || w2.Version <= w.Version {
		t.Fatalf("replace: %+v %+v %v", w2, before, err)
	}
	seen(fa, func(x *overrides.Override) bool { return x != nil && x.Rate == 300 })

	if _, err := a.Delete(ctx, w2.ID, w.Version, now); !errors.Is(err, overrides.ErrVersion) {
		t.Fatalf("delete at an old version: %v", err)
	}
	if _, err := a.Delete(ctx, w2.ID, w2.Version, now); err != nil {
		t.Fatal(err)
	}
	seen(fb, func(x *overrides.Override) bool { return x == nil })
	if _, err := a.Delete(ctx, w2.ID, -1, now); !errors.Is(err, overrides.ErrNotFound) {
		t.Fatalf("delete again: %v", err)
	}

	// An expired override is dropped by the next change, with no timer.
	short := overrides.Override{Rule: "r", Key: "short", Action: overrides.Exempt, Expires: now.Add(time.Second), Reason: "x", By: "y"}
	if _, _, err := a.Put(ctx, short, 0, now); err != nil {
		t.Fatal(err)
	}
	later := now.Add(2 * time.Second)
	o.Key = "other"
	if _, _, err := a.Put(ctx, o, 0, later); err != nil {
		t.Fatal(err)
	}
	list, _, err := b.Load(ctx)
	if err != nil || len(list) != 1 || list[0].Key != "other" {
		t.Fatalf("after the expiry and a change: %v %v, want only the new one", list, err)
	}
}

// A Redis that loses its data (FLUSHALL, a restart without persistence)
// starts its versions anew from the time: a follower that had version V
// never takes other contents for V, and follows what is set after.
func TestOverridesAfterRedisLostItsData(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	s, err := redis.New(redis.Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ov := s.Overrides()
	f := &overrides.Follower{Store: ov, Reread: time.Hour}
	now := time.Now()
	a := overrides.Override{Rule: "r", Key: "a", Action: overrides.Block, Expires: now.Add(time.Hour), Reason: "x", By: "y"}
	if _, _, err := ov.Put(ctx, a, 0, now); err != nil {
		t.Fatal(err)
	}
	if err := f.Refresh(ctx); err != nil || f.Current().Find("r", "a", now) == nil {
		t.Fatalf("before: %v", err)
	}
	if _, err := srv.Do("FLUSHALL"); err != nil {
		t.Fatal(err)
	}
	b := a
	b.Key = "b"
	if _, _, err := ov.Put(ctx, b, 0, now.Add(time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if err := f.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if set := f.Current(); set.Find("r", "a", now) != nil || set.Find("r", "b", now) == nil {
		t.Fatalf("after the flush and one change: a %v, b %v; want only b", set.Find("r", "a", now), set.Find("r", "b", now))
	}
}
