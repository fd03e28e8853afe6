package fleet

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/algo"
	"github.com/sluice-rl/sluice/internal/testkit/proctest"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// exactRules has two rules of 100 per hour per user for each algorithm,
// each on a path of its own: /ALGORITHM answers a store call past its
// deadline from the gateway's share (the default), /ALGORITHM/wait waits
// for the store (onSlowStore: wait).
func exactRules() string {
	var b strings.Builder
	b.WriteString("rules:\n")
	for _, a := range sluice.Algorithms() {
		fmt.Fprintf(&b, "  - {id: %s, match: {path: /%s}, key: [user], rate: 100, per: 1h, algorithm: %s}\n", a, a, a)
		fmt.Fprintf(&b, "  - {id: %s-wait, match: {path: /%s/wait}, key: [user], rate: 100, per: 1h, algorithm: %s, onSlowStore: wait}\n", a, a, a)
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

// With default settings, three `sluice serve` processes on one
// redis-server and on a 3-master Redis Cluster, while three busy loops
// share the machine's two cores, admit of 1,000 checks from 64 callers on
// one key what the algorithm admits (100; 101 for the leaky queue, whose
// first unit leaves at once), for every algorithm, cold and warm:
//
//   - a rule with onSlowStore: wait is never over, and under only by its
//     degraded answers (a store call that took longer than its wait, which
//     a healthy Redis does not);
//   - a rule answering from its share (the default) is over by at most its
//     degraded admissions, and by at most L, the bound docs/redis.md
//     states for N gateways' stale looks (E): a call that
//     misses its deadline on a starved machine is answered from the
//     gateway's part of what the store last said was left, and only such an
//     answer can admit what the store would not have; it is under only by
//     its degraded answers.
//
// The figures are logged: what was over, and how many answers degraded.
//
// Every degraded answer is counted as a failed store call and the breakers
// stay closed: a healthy Redis behind a busy gateway is not a failed one.
func TestServeProcessesOnHealthyRedisAreExactUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	redistest.Need(t) // skip here, not only in every subtest
	proctest.BusyLoops(t, 3)
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
			var degraded, over int64
			for _, phase := range []string{"cold", "warm"} {
				for _, a := range sluice.Algorithms() {
					want := int64(expectedAdmitted(t, a, 1000))
					for _, path := range []string{"/" + a.String(), "/" + a.String() + "/wait"} {
						user := topo + "-" + phase
						o := proctest.Load(t, bases, path, user, 1000)
						degraded += o.Degraded
						over += max(0, o.Admitted-want)
						waits := strings.HasSuffix(path, "/wait")
						switch {
						case waits && o.Admitted > want:
							t.Errorf("%s, %s: admitted %d, over the %d the algorithm admits, with onSlowStore: wait (%d degraded answers)", path, phase, o.Admitted, want, o.Degraded)
						case o.Admitted-want > o.DegradedAdmitted:
							t.Errorf("%s, %s: admitted %d, over the %d the algorithm admits by more than its %d degraded admissions", path, phase, o.Admitted, want, o.DegradedAdmitted)
						case o.Admitted-want > staleBound(want):
							t.Errorf("%s, %s: admitted %d, over the %d the algorithm admits by more than the stale looks' bound of %d", path, phase, o.Admitted, want, staleBound(want))
						case want-o.Admitted > o.Degraded:
							t.Errorf("%s, %s: admitted %d, under the %d the algorithm admits by more than its %d degraded answers", path, phase, o.Admitted, want, o.Degraded)
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
			if float64(degraded) > failed {
				t.Errorf("%d degraded answers and %v failed store calls: want each degraded answer counted as a failed call", degraded, failed)
			}
			t.Logf("%s: %d over in all, %d degraded answers (%v failed store calls); the scheduling latency added at most %v to a store call's deadline (at most %v in all)", topo,
				over, degraded, failed, time.Duration(peakSched.Load()).Round(time.Millisecond), time.Duration(peakDeadline.Load()).Round(time.Millisecond))
		})
	}
}

// With default settings (four Go processors a CPU among them), three
// `sluice gateway` processes on one redis-server, while three busy loops
// share the machine's two cores, let through of 1,000 requests from 64
// callers on one key what the algorithm admits, for every algorithm, cold
// and warm: over it only by answers degraded (the gateways' failed store
// calls, each one such answer) and never past the stale looks' bound; the
// rules that wait for the store never over it.
func TestGatewayProcessesOnHealthyRedisAreExactUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	redistest.Need(t)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") }))
	defer upstream.Close()
	proctest.BusyLoops(t, 3)
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(exactRules()), 0o600); err != nil {
		t.Fatal(err)
	}
	url := redistest.Start(t).URL()
	var bases, admins []string
	for range 3 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		admin := l.Addr().String()
		l.Close()
		b, _ := start(t, "gateway", "--listen", "127.0.0.1:0", "--admin-listen", admin, "--watch", "0",
			"--config", rulesPath, "--store", url, "--upstream", upstream.URL)
		bases, admins = append(bases, b), append(admins, "http://"+admin)
	}
	for _, a := range admins {
		if n := proctest.Metric(t, a, "go_sched_gomaxprocs_threads"); n < 4 {
			t.Fatalf("%s runs %v Go processors: not the gateway's default", a, n)
		}
	}
	failed := func() (n float64) {
		for _, a := range admins {
			n += proctest.Metric(t, a, "sluice_store_errors_total")
		}
		return n
	}
	var over int64
	for _, phase := range []string{"cold", "warm"} {
		for _, a := range sluice.Algorithms() {
			want := int64(expectedAdmitted(t, a, 1000))
			if a == sluice.LeakyQueue {
				// The queue's first unit leaves at once; each later one
				// would wait 36 s more, past the 10 s a gateway holds a
				// request, and is refused with its unit given back.
				want = 1
			}
			for _, path := range []string{"/" + a.String(), "/" + a.String() + "/wait"} {
				before := failed()
				o, _ := proctest.Spread(t, proctest.Checks{Bases: bases, Path: path, Users: []string{"gw-" + phase}, PerUser: 1000, Gateway: true})
				degraded := int64(failed() - before)
				over += max(0, o.Admitted-want)
				switch {
				case strings.HasSuffix(path, "/wait") && o.Admitted > want:
					t.Errorf("%s, %s: let through %d, over the %d the algorithm admits, with onSlowStore: wait", path, phase, o.Admitted, want)
				case o.Admitted-want > degraded:
					t.Errorf("%s, %s: let through %d, over the %d the algorithm admits by more than its %d degraded answers", path, phase, o.Admitted, want, degraded)
				case o.Admitted-want > staleBound(want):
					t.Errorf("%s, %s: let through %d, over the %d the algorithm admits by more than the stale looks' bound of %d", path, phase, o.Admitted, want, staleBound(want))
				case want-o.Admitted > degraded:
					t.Errorf("%s, %s: let through %d, under the %d the algorithm admits by more than its %d degraded answers", path, phase, o.Admitted, want, degraded)
				}
			}
		}
	}
	for _, a := range admins {
		if state := proctest.Metric(t, a, "sluice_store_breaker_state"); state != 0 {
			t.Errorf("%s: the breaker opened (%v) while Redis was healthy", a, state)
		}
	}
	t.Logf("%d over in all, %v failed store calls", over, failed())
}

// staleBound is the most N gateways' stale looks at a key can admit over
// what the store would have (docs/redis.md, E): one limit, when every
// gateway's look is stale by a whole limit (a fresh key the store spent
// before any of them asked), N parts of L/N.
func staleBound(limit int64) int64 { return limit }
