package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/internal/testkit/proctest"
	"github.com/sluice-rl/sluice/internal/testkit/rlqstest"
	"github.com/sluice-rl/sluice/store/redis/redistest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// quotaFleet runs Envoys, played by rlqstest on the wall clock, against
// `sluice serve` processes: each Envoy makes its requests at the rate its
// group's phase asks (busy or idle) and reports every second, as the
// filter's reporting_interval of 1 s does.
type quotaFleet struct {
	t       *testing.T
	envoys  []*rlqstest.Envoy
	group   []int        // each Envoy's group
	latency atomic.Int64 // the slowest answer to a report, ns
	clock   sluice.Clock
}

func startQuotaServe(t *testing.T, rules string, extra ...string) (addr, base string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "quota.yaml")
	if err := os.WriteFile(path, []byte(rules), 0o600); err != nil {
		t.Fatal(err)
	}
	addr = freeAddr(t)
	base, _ = start(t, append([]string{"serve", "--listen", "127.0.0.1:0", "--watch", "0", "--grpc-listen", addr, "--config", path}, extra...)...)
	// The banner names only the HTTP listener: the gRPC one is known to
	// serve once its health check answers.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("the gRPC listener %s never answered: %v", addr, err)
	}
	return addr, base
}

func (f *quotaFleet) join(t *testing.T, addr string, n, groups int, bucket map[string]string) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	for i := range n {
		e, err := rlqstest.New(conn, f.clock, fmt.Sprintf("%s/%d", addr, i), "quota", bucket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Leave)
		f.envoys = append(f.envoys, e)
		f.group = append(f.group, len(f.envoys)%groups)
	}
}

// run drives the Envoys for d: the group busy at each moment is
// busyGroup(elapsed), the others idle.
func (f *quotaFleet) run(d time.Duration, busy, idle float64, busyGroup func(time.Duration) int) {
	start := time.Now()
	var wg sync.WaitGroup
	for i, e := range f.envoys {
		wg.Go(func() {
			offset := time.Duration(i) * time.Second / time.Duration(len(f.envoys))
			time.Sleep(offset)
			e.Report() // a new bucket is reported at once
			acc, last, nextReport := 0.0, time.Now(), time.Now().Add(time.Second)
			for el := time.Since(start); el < d; el = time.Since(start) {
				rate := idle
				if f.group[i] == busyGroup(el) {
					rate = busy
				}
				now := time.Now()
				for acc += rate * now.Sub(last).Seconds(); acc >= 1; acc-- {
					e.Request()
				}
				last = now
				if now.After(nextReport) {
					if !e.Report() {
						return
					}
					nextReport = nextReport.Add(time.Second)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	wg.Wait()
}

// The built binary, default flags, embedded store, three busy loops on
// the machine's cores: 64 Envoys on one bucket limited to 1,000 per 10 s,
// the busy group of 16 moving every 5 s. Over every 10 s they admit at most
// 1,000, plus the bursts they held or were handed in it, plus the rule's
// rate over the delivery grace (250 ms: an assignment on its way); and the
// busy group gets most of its part from a second after demand moved.
func TestQuotaServiceDividesALimitAmong64EnvoysEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	rules := "rules:\n  - id: shared\n    envoy: {domain: quota, descriptors: [{key: name, value: shared}]}\n    rate: 1000\n    per: 10s\n"
	addr, base := startQuotaServe(t, rules)
	f := &quotaFleet{t: t, clock: sluice.NewSystemClock()}
	f.join(t, addr, 64, 4, map[string]string{"name": "shared"})
	proctest.BusyLoops(t, 3)
	begin := f.clock.Now()
	phase := 5 * time.Second
	f.run(4*phase, 20, 0.2, func(el time.Duration) int { return int(el/phase) % 4 })
	end := f.clock.Now()
	w := rlqstest.Windows(f.envoys, begin, end, 10*time.Second, 10*time.Millisecond, 1000, 100*0.25)
	t.Logf("most admitted in any 10 s: %.0f of 1,000 (bursts in it %.0f)", w.Most, w.Bursts)
	if streams, refused := proctest.Metric(t, base, "sluice_rlqs_streams"), proctest.Metric(t, base, "sluice_rlqs_refused_total"); streams != 64 || refused != 0 {
		t.Errorf("metrics: %v streams, %v refused; want 64, 0", streams, refused)
	}
	if w.Over != "" {
		t.Fatalf("over the limit plus the bursts and an answer's delay: %s", w.Over)
	}
	for p := range 4 {
		from, to := begin+int64(time.Duration(p)*phase+time.Second), begin+int64(time.Duration(p+1)*phase)
		busy, idle := 0, 0
		for i, e := range f.envoys {
			for _, at := range e.Admitted() {
				if at >= from && at < to {
					if f.group[i] == p {
						busy++
					} else {
						idle++
					}
				}
			}
		}
		// The busy group's fair part: 95 of the 100 a second divided, less
		// the floors of the 48 idle Envoys.
		want := 0.5 * (95 - 48*95.0/(4*64)) * time.Duration(to-from).Seconds()
		t.Logf("phase %d: busy group %d, idle %d admitted", p, busy, idle)
		if float64(busy) < want {
			t.Errorf("phase %d: the busy group admitted %d, want at least %.0f", p, busy, want)
		}
	}
}

// Two `sluice serve` processes on one Redis, four Envoys on each, the busy
// pair moving between the processes: the processes divide the limit by
// what their Envoys claim (their claims in Redis), so the eight admit over
// every 10 s at most the limit, plus the bursts they held or were handed,
// plus the rule's rate over the delivery grace: the bound of one process.
// (Every grant is also paid in the shared store, so even without the
// claims they could not pass what the rule admits over 10 s and a grant's
// life.)
func TestQuotaServiceHoldsTheLimitAcrossServeProcessesEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	url := redistest.Start(t).URL()
	rules := "rules:\n  - id: shared\n    envoy: {domain: quota, descriptors: [{key: name, value: shared}]}\n    rate: 100\n    per: 10s\n"
	f := &quotaFleet{t: t, clock: sluice.NewSystemClock()}
	for range 2 {
		addr, _ := startQuotaServe(t, rules, "--store", url)
		f.join(t, addr, 4, 2, map[string]string{"name": "shared"})
	}
	for i := range f.group {
		f.group[i] = i / 4 // the busy group: one process's four Envoys, then the other's
	}
	begin := f.clock.Now()
	f.run(18*time.Second, 20, 0.2, func(el time.Duration) int { return int(el/(6*time.Second)) % 2 })
	end := f.clock.Now()
	w := rlqstest.Windows(f.envoys, begin, end, 10*time.Second, 10*time.Millisecond, 100, 10*0.25)
	t.Logf("most admitted in any 10 s across both processes: %.0f of 100 (bursts in it %.0f)", w.Most, w.Bursts)
	if w.Over != "" {
		t.Fatalf("over the limit plus the bursts and an answer's delay: %s", w.Over)
	}
	// Capacity follows the busy pair from one process to the other: from
	// 2 s after each move, the busy four admit at least half of what the
	// limit leaves beside the idle four's claims.
	for p := range 3 {
		from, to := begin+int64(time.Duration(p)*6*time.Second+2*time.Second), begin+int64(time.Duration(p+1)*6*time.Second)
		busy := 0
		for i, e := range f.envoys {
			for _, at := range e.Admitted() {
				if f.group[i] == p%2 && at >= from && at < to {
					busy++
				}
			}
		}
		t.Logf("phase %d: the busy four admitted %d", p, busy)
		if busy < 14 {
			t.Errorf("phase %d: the busy four admitted %d in 4 s, want at least 14 (half of about 7 a second)", p, busy)
		}
	}
	if w.Most < 50 {
		t.Fatalf("only %.0f admitted in the busiest 10 s: the Envoys were starved", w.Most)
	}
}
