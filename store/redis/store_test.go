package redis_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/redis"
	"github.com/sluice-rl/sluice/store/redis/redistest"
	"github.com/sluice-rl/sluice/store/storetest"
)

var prefixes atomic.Int64

// The conformance suite against a real redis-server, with the test's clock
// sent as the time: decisions identical to package algo at microsecond
// resolution.
func TestConformanceSingleNode(t *testing.T) {
	srv := redistest.Start(t)
	storetest.RunWith(t, func(t *testing.T, c sluice.Clock) sluice.Store {
		s, err := redis.New(redis.Options{URL: srv.URL(), Clock: c, Prefix: fmt.Sprintf("t%d:", prefixes.Add(1))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}, storetest.Options{Resolution: time.Microsecond})
}

// The same suite against a real three-master Redis Cluster.
func TestConformanceCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	storetest.RunWith(t, func(t *testing.T, c sluice.Clock) sluice.Store {
		s, err := redis.New(redis.Options{URL: cl.URL(), Clock: c, Prefix: fmt.Sprintf("c%d:", prefixes.Add(1))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}, storetest.Options{Resolution: time.Microsecond})
}
