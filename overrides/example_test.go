package overrides_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-rl/sluice/overrides"
)

// An operator raises one key's limit for a day; every process following
// the store finds it for that key, and nothing for another.
func Example() {
	ctx := context.Background()
	store := &overrides.Memory{} // or a Redis store's Overrides()
	f := &overrides.Follower{Store: store}
	now := time.Now()
	o := overrides.Override{Rule: "per-key", Key: "k-partner", Action: overrides.Limit, Rate: 5000, Per: overrides.Duration(time.Minute),
		Expires: now.Add(24 * time.Hour), Reason: "launch week", By: "ops"}
	if err := o.Check(now); err != nil {
		fmt.Println(err)
		return
	}
	if _, _, err := store.Put(ctx, o, 0, now); err != nil {
		fmt.Println(err)
		return
	}
	f.Refresh(ctx) // Run follows the store; Refresh reads it now
	set := f.Current()
	fmt.Println(set.Find("per-key", "k-partner", now).Rate)
	fmt.Println(set.Find("per-key", "k-other", now) == nil)
	// Output:
	// 5000
	// true
}
