package concurrency_test

import (
	"context"
	"fmt"

	"github.com/sluice-rl/sluice/concurrency"
)

// A limiter hands out permits while fewer than its limit are held; a
// request that gets none is shed at once (or waits, with a queue). Each
// permit is released with how its request ended, which an adaptive
// algorithm (AIMD, Gradient2) follows.
func ExampleLimiter() {
	l := concurrency.New(concurrency.Fixed{N: 2}, concurrency.Options{})
	ctx := context.Background()
	a, _ := l.Acquire(ctx)
	b, _ := l.Acquire(ctx)
	_, err := l.Acquire(ctx)
	fmt.Println(l.InFlight(), err != nil, l.Shed())

	a.Release(concurrency.Success)
	c, err := l.Acquire(ctx)
	fmt.Println(l.InFlight(), err)
	b.Release(concurrency.Success)
	c.Release(concurrency.Success)
	// Output:
	// 2 true 1
	// 2 <nil>
}
