package sluice_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/memory"
)

// A limit as an author writes it, and what a store decides for it: a
// burst of 3 at once, then one every 20 seconds (3 per minute).
func Example() {
	limit, err := sluice.ParseLimit("3/1m")
	if err != nil {
		panic(err)
	}
	clock := sluice.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := memory.New(memory.WithClock(clock))
	defer store.Close()

	takes := []sluice.Take{{Rule: "login", Key: "alice", Limit: limit, Cost: 1}}
	out := make([]sluice.Decision, 1)
	for range 4 {
		if err := store.Take(context.Background(), takes, out); err != nil {
			panic(err)
		}
		fmt.Println(out[0].Allowed, out[0].Remaining, out[0].RetryAfter)
	}
	clock.Advance(20 * time.Second) // one unit's interval
	store.Take(context.Background(), takes, out)
	fmt.Println(out[0].Allowed, out[0].Remaining)
	// Output:
	// true 2 0s
	// true 1 0s
	// true 0 0s
	// false 0 20s
	// true 0
}

// ParseLimit reads a rate per period; Validate says what is wrong with a
// limit built by hand.
func ExampleParseLimit() {
	l, _ := sluice.ParseLimit("100/1h")
	fmt.Println(l.Rate, l.Period, l.Interval())
	fmt.Println(sluice.Limit{Rate: 10, Period: time.Second, Burst: 5, Algorithm: sluice.FixedWindow}.Validate() != nil)
	// Output:
	// 100 1h0m0s 36s
	// true
}
