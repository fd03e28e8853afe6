package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/overrides"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// A change sent to a Redis that hangs is never made after its caller gave
// up, wherever Redis hung: before the change's clock read (the change is
// never sent), or after it (the change waits in the connection, and the
// script, run when Redis wakes, refuses to run past the deadline). Without
// the deadline both changes land on resume, after "nothing changed".
func TestAChangeOnAHungRedisIsNeverMadeLater(t *testing.T) {
	srv := redistest.Start(t)
	s, err := New(Options{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ov := s.Overrides()
	now := time.Now()
	kept := overrides.Override{Rule: "r", Key: "kept", Action: overrides.Block, UntilRemoved: true, Reason: "x", By: "y"}
	if _, _, err := ov.Put(context.Background(), kept, 0, now); err != nil {
		t.Fatal(err)
	}
	id := overrides.IDOf("r", "kept", "")
	const wait = 300 * time.Millisecond

	for _, hang := range []string{"before the clock", "after the clock"} {
		t.Run(hang, func(t *testing.T) {
			resumed := make(chan struct{})
			pause := func() {
				srv.Pause()
				go func() { // wake it past the deadline, within the grace
					time.Sleep(wait + 300*time.Millisecond)
					srv.Resume()
					close(resumed)
				}()
			}
			if hang == "after the clock" {
				afterClock = pause
				defer func() { afterClock = nil }()
			} else {
				pause()
			}
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			_, _, putErr := ov.Put(ctx, overrides.Override{Rule: "r", Key: "new", Action: overrides.Exempt, UntilRemoved: true, Reason: "x", By: "y"}, 0, now)
			cancel()
			<-resumed
			if hang == "after the clock" {
				afterClock = func() { afterClock = nil; pause() } // the delete's turn
				resumed = make(chan struct{})
			} else {
				resumed = make(chan struct{})
				pause()
			}
			ctx, cancel = context.WithTimeout(context.Background(), wait)
			_, delErr := ov.Delete(ctx, id, -1, now)
			cancel()
			<-resumed
			for _, err := range []error{putErr, delErr} {
				if !errors.Is(err, overrides.ErrNotMade) {
					t.Errorf("a change on a Redis that hung %s: %v, want %v", hang, err, overrides.ErrNotMade)
				}
			}
			time.Sleep(100 * time.Millisecond) // what Redis had queued has run
			list, _, err := ov.Load(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if len(list) != 1 || list[0].ID != id {
				t.Fatalf("after Redis woke: %v; want only %s, nothing changed", list, id)
			}
		})
	}
}

// A store that sends its own clock reads no clock from Redis for a change
// (its server may refuse TIME in scripts) and still makes it.
func TestAChangeWithTheStoresOwnClockIsMade(t *testing.T) {
	srv := redistest.Start(t)
	s, err := New(Options{URL: srv.URL(), Clock: sluice.NewManualClock(time.Now())})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	called := false
	afterClock = func() { called = true }
	defer func() { afterClock = nil }()
	o := overrides.Override{Rule: "r", Key: "k", Action: overrides.Block, UntilRemoved: true, Reason: "x", By: "y"}
	if _, _, err := s.Overrides().Put(ctx, o, 0, time.Now()); err != nil {
		t.Fatal(err)
	}
	if called {
		t.Error("a store with its own clock read Redis's for a change")
	}
	if list, _, err := s.Overrides().Load(context.Background()); err != nil || len(list) != 1 {
		t.Fatalf("after the change: %v %v", list, err)
	}
}
