package fleet

import (
	"fmt"
	"github.com/sluice-rl/sluice/internal/proctest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// exactRules has one rule of 100 per hour per user for each algorithm, on a
// path of its own.
func exactRules() string {
	var b strings.Builder
	b.WriteString("rules:\n")
	for _, a := range sluice.Algorithms() {
		fmt.Fprintf(&b, "  - {id: %s, match: {path: /%s}, key: [user], rate: 100, per: 1h, algorithm: %s}\n", a, a, a)
	}
	return b.String()
}

// expectedAdmitted is what the algorithm admits of n takes at one instant.
func expectedAdmitted(t *testing.T, a sluice.Algorithm, n int) int {
	p, err := algo.NewParams(sluice.Limit{Rate: 100, Period: time.Hour, Algorithm: a})
	if err != nil {
		t.Fatal(err)
	}
	s := algo.NewState(p)
	now := time.Now().UnixNano()
	admitted := 0
	for range n {
		var r algo.Result
		s.Take(now, 1, &r)
		if r.Allowed {
			admitted++
		}
	}
	return admitted
}

// busyLoops runs n shell loops that spin (`while :; do :; done`) until
// the test ends: a machine whose cores are taken, as a gateway's are in the
// traffic spike a limiter exists for.
func busyLoops(t *testing.T, n int) {
	t.Helper()
	for range n {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
}

// With default settings, 2 and 3 `sluice serve` processes on one
// redis-server and on a 3-master Redis Cluster admit exactly what the
// algorithm admits (100 of 1,000 from 64 callers on one key, 101 for the
// leaky queue, whose first unit leaves at once), for every algorithm, cold
// and warm, while three busy loops share the machine's cores: a healthy
// Redis behind a busy gateway is never mistaken for a failed one. No check
// is admitted over the limit and the breakers stay closed. A store call may
// still miss its deadline when Redis itself is starved of CPU (seen once in
// 56,000 checks, with three more busy loops of a loaded test run on top):
// its check is answered degraded, within the share, so its user can only
// be under; each such answer must be counted as a failed store call
// (sluice_store_errors_total), each unit under explained by one, and there
// may be at most 10 in all.
func TestServeProcessesOnHealthyRedisAreExactUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	redistest.Need(t) // skip here, not only in every subtest
	busyLoops(t, 3)
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(exactRules()), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, topo := range []string{"single", "cluster"} {
		t.Run(topo, func(t *testing.T) {
			var url string
			if topo == "single" {
				url = redistest.Start(t).URL()
			} else {
				url = redistest.StartCluster(t).URL()
			}
			var bases []string
			for range 3 {
				b, _ := start(t, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--config", rulesPath, "--store", url)
				bases = append(bases, b)
			}
			// What the busy loops add to the store's deadline, sampled
			// four times a second while the checks run.
			var peakSched, peakDeadline atomic.Int64
			stop := make(chan struct{})
			sampled := make(chan struct{})
			go func() {
				defer close(sampled)
				for {
					select {
					case <-stop:
						return
					case <-time.After(250 * time.Millisecond):
					}
					for _, b := range bases {
						sched, _ := proctest.ReadMetric(b, "sluice_scheduling_delay_seconds")
						deadline, _ := proctest.ReadMetric(b, "sluice_store_deadline_seconds")
						peakSched.Store(max(peakSched.Load(), int64(sched*1e9)))
						peakDeadline.Store(max(peakDeadline.Load(), int64(deadline*1e9)))
					}
				}
			}()
			var degraded int64
			for _, procs := range []int{2, 3} {
				for _, phase := range []string{"cold", "warm"} {
					for _, a := range sluice.Algorithms() {
						user := fmt.Sprintf("%s-%d-%s", topo, procs, phase)
						o := proctest.Load(t, bases[:procs], "/"+a.String(), user, 1000)
						degraded += o.Degraded
						want := int64(expectedAdmitted(t, a, 1000))
						if o.Admitted > want || want-o.Admitted > o.Degraded {
							t.Errorf("%d processes, %s, %v: admitted %d, want exactly %d (%d degraded answers)", procs, phase, a, o.Admitted, want, o.Degraded)
						}
					}
				}
			}
			close(stop)
			<-sampled
			var failed float64
			for _, b := range bases {
				if state := proctest.Metric(t, b, "sluice_store_breaker_state"); state != 0 {
					t.Errorf("%s: the breaker opened (%v) while Redis was healthy", b, state)
				}
				failed += proctest.Metric(t, b, "sluice_store_errors_total")
			}
			if float64(degraded) > failed || degraded > 10 {
				t.Errorf("%d degraded answers and %v failed store calls: want each degraded answer counted as a failed call, and at most 10", degraded, failed)
			}
			t.Logf("%s: %d degraded answers (%v failed store calls); the scheduling latency added at most %v to a store call's deadline (at most %v in all)", topo,
				degraded, failed, time.Duration(peakSched.Load()).Round(time.Millisecond), time.Duration(peakDeadline.Load()).Round(time.Millisecond))
		})
	}
}
