package memory_test

import (
	"fmt"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/memory"
)

// A Limiter is one rule of the embedded store, for a program that knows its
// limit up front: no rule file, no engine, one call per request.
func ExampleStore_Limiter() {
	clock := sluice.NewManualClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	store := memory.New(memory.WithClock(clock))
	defer store.Close()
	perUser, err := store.Limiter("api", sluice.Limit{Rate: 2, Period: time.Second})
	if err != nil {
		panic(err)
	}
	fmt.Println(perUser.Allow("alice"), perUser.Allow("alice"), perUser.Allow("alice"))
	fmt.Println(perUser.Allow("bob")) // every key counts on its own

	d, _ := perUser.Take("alice", 1)
	fmt.Println(d.Allowed, d.RetryAfter)
	clock.Advance(d.RetryAfter)
	fmt.Println(perUser.Allow("alice"))
	// Output:
	// true true false
	// true
	// false 500ms
	// true
}
