package redis_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/store/redis"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// The race experiment for real: two gateway processes, each with its own
// store and client, share one Redis; 1,000 requests from 64 goroutines
// (32 in each) hit one key with a limit of 100. Exactly 100 are admitted,
// for every algorithm that is exact by definition. Time is the server's.
func TestTwoProcessesShareOneExactCount(t *testing.T) {
	redistest.Need(t) // skip here, not only in every subtest
	t.Run("single", func(t *testing.T) { raceAll(t, redistest.Start(t).URL()) })
	t.Run("cluster", func(t *testing.T) { raceAll(t, redistest.StartCluster(t).URL()) })
}

func raceAll(t *testing.T, url string) {
	for _, a := range sluice.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			var wg sync.WaitGroup
			var total atomic.Int64
			for p := range 2 {
				wg.Go(func() {
					cmd := exec.Command(os.Args[0], "-test.run=^TestRaceGatewayProcess$", "-test.count=1")
					cmd.Env = append(os.Environ(), "SLUICE_RACE_URL="+url, "SLUICE_RACE_ALG="+a.String(),
						"SLUICE_RACE_KEY=race-"+a.String(), "SLUICE_RACE_PROCESS="+strconv.Itoa(p))
					var out bytes.Buffer
					cmd.Stdout, cmd.Stderr = &out, &out
					if err := cmd.Run(); err != nil {
						t.Errorf("gateway process %d: %v\n%s", p, err, out.String())
						return
					}
					for _, line := range strings.Split(out.String(), "\n") {
						if n, ok := strings.CutPrefix(line, "admitted "); ok {
							v, _ := strconv.Atoi(n)
							total.Add(int64(v))
						}
					}
				})
			}
			wg.Wait()
			// Exactly what the algorithm admits of 1,000 at one instant: 100,
			// and 101 for the leaky queue, whose first unit leaves at once.
			want := int64(100)
			if a == sluice.LeakyQueue {
				want = 101
			}
			if total.Load() != want {
				t.Fatalf("two gateways admitted %d, want exactly %d", total.Load(), want)
			}
		})
	}
}

// TestRaceGatewayProcess is one gateway of the experiment above, run as a
// separate process; alone it does nothing.
func TestRaceGatewayProcess(t *testing.T) {
	url := os.Getenv("SLUICE_RACE_URL")
	if url == "" {
		t.Skip("a helper process of TestTwoProcessesShareOneExactCount")
	}
	a, err := sluice.ParseAlgorithm(os.Getenv("SLUICE_RACE_ALG"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := redis.New(redis.Options{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// A year-long period: the server's clock is real, and a window boundary
	// crossed during the run would reset a fixed window (as it should).
	l := sluice.Limit{Rate: 100, Period: 365 * 24 * time.Hour, Algorithm: a}
	key := os.Getenv("SLUICE_RACE_KEY")
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range 32 {
		n := 500 / 32 // 500 requests from 32 goroutines: 20 of them make 16, 12 make 15
		if g < 500%32 {
			n++
		}
		wg.Go(func() {
			out := make([]sluice.Decision, 1)
			for range n {
				if err := s.Take(context.Background(), []sluice.Take{{Rule: "race", Key: key, Limit: l, Cost: 1}}, out); err != nil {
					t.Error(err)
					return
				}
				if out[0].Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	fmt.Printf("admitted %d\n", admitted.Load())
}
