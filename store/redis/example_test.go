package redis_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/redis"
)

// A store on Redis decides with Redis's clock in one Lua script per call:
// every gateway on the same Redis (or Redis Cluster, with a
// redis-cluster:// URL) shares the count. It needs a redis-server, so this
// example is compiled but not run.
func ExampleNew() {
	store, err := redis.New(redis.Options{URL: "redis://127.0.0.1:6379/0"})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	takes := []sluice.Take{{Rule: "api", Key: "alice", Limit: sluice.Limit{Rate: 100, Period: time.Minute}, Cost: 1}}
	out := make([]sluice.Decision, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := store.Take(ctx, takes, out); err != nil {
		fmt.Println("redis:", err) // the engine answers this by each rule's failMode
		return
	}
	fmt.Println(out[0].Allowed, out[0].Remaining)
}
