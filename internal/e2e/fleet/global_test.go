package fleet

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testkit/proctest"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// globalRules: one limit of 100 a second (a burst of 100) across three
// regions, with the defaults (period 1s, lease 3s, no borrowing).
const globalRules = `
rules:
  - id: per-user-global
    key: [user]
    rate: 100
    per: 1s
    algorithm: token-bucket
    global:
      regions: {eu: 34%, us: 33%, ap: 33%}
`

// The scenario's settings, as the rule file and the links make them.
const (
	gRate     = 100.0 // units a second, and the burst
	gPeriod   = time.Second
	gLease    = 3 * time.Second
	gOneWay   = 75 * time.Millisecond
	gDemand   = 250 // requests a second from a busy region
	gRTT      = 2 * gOneWay
	gSettle   = 2*gPeriod + gRTT // a move's promise
	gRegionUS = 1
	gRegionAP = 2
)

// gPhase is who is busy from at on.
type gPhase struct {
	at   time.Duration
	busy []int
}

// Three regions, each with its own redis-server and `sluice serve` started
// with its region (two in eu, pooling their demand, one leading), eu's
// Redis the home every region reaches; the links from us and ap to it pass
// through a proxy adding 75 ms each way.
// One user's demand moves us -> eu -> ap; then ap, busy and holding most
// of the limit, is cut off from the home for 10 s while eu is busy too,
// and mended. Every admission is logged on the test's one clock:
//   - over every interval, the regions together admit no more than the
//     limit's token bucket allows (burst + rate x length, the length
//     widened by the slowest answer, since a decision happens somewhere
//     between a check's sending and its answer);
//   - after each move, from 2T + RTT on, the busy region gets >= 95% of
//     min(limit, what it asked);
//   - cut off, ap falls to its own share within the lease and a tick, and
//     eu has the rest of the limit from the lease and 2T + RTT on.
func TestOneLimitAcrossThreeRegionsEndToEnd(t *testing.T) {
	proctest.Exclusive(t)
	if testing.Short() {
		t.Skip("builds the binary and runs for 40 s")
	}
	redistest.Need(t)
	rules := proctest.WriteRules(t, globalRules)
	names := []string{"eu", "us", "ap"}
	var stores [3]*redistest.Server
	for i := range stores {
		stores[i] = redistest.Start(t)
	}
	home := stores[0]
	links := make([]*redistest.Proxy, 3)
	bases := make([][]string, 3) // each region's processes
	var all []string
	for i, name := range names {
		homeURL := home.URL()
		if i != 0 {
			links[i] = redistest.NewProxy(t, home.Addr)
			links[i].SetDelay(gOneWay)
			homeURL = "redis://" + links[i].Addr
		}
		processes := 1
		if i == 0 {
			processes = 2 // eu's two pool their demand; one of them leads
		}
		for range processes {
			base, _ := start(t, "serve", "--config", rules, "--listen", "127.0.0.1:0",
				"--store", stores[i].URL(), "--region", name, "--global-home", homeURL)
			bases[i] = append(bases[i], base)
			all = append(all, base)
		}
	}
	proctest.WaitHealthy(t, all)

	const (
		move1 = 8 * time.Second
		move2 = 16 * time.Second
		cutAt = 26 * time.Second
		heal  = 36 * time.Second
		end   = 40 * time.Second
	)
	phases := []gPhase{{0, []int{gRegionUS}}, {move1, []int{0}}, {move2, []int{gRegionAP}}, {cutAt, []int{0, gRegionAP}}}
	log := runDemand(t, bases, phases, end, func(at time.Duration) {
		switch at {
		case cutAt:
			links[gRegionAP].SetCut(true)
		case heal:
			links[gRegionAP].SetCut(false)
		}
	}, []time.Duration{cutAt, heal})

	t.Logf("admitted a second (eu us ap):\n%s", log.perSecond(end, len(names)))
	// One of eu's two processes leads its exchanges; us and ap lead theirs.
	leads := 0.0
	for _, b := range bases[0] {
		leads += proctest.Metric(t, b, "sluice_global_lead")
	}
	if leads != 1 || proctest.Metric(t, bases[gRegionUS][0], "sluice_global_exchanges_total") == 0 {
		t.Errorf("eu's processes lead %v times (want 1); us made %v exchanges", leads, proctest.Metric(t, bases[gRegionUS][0], "sluice_global_exchanges_total"))
	}
	// The bound, over every interval.
	over, where := log.worstInterval(gRate, gRate)
	t.Logf("admitted %d of %d asked in %v; slowest answer %v; worst interval %s, %.1f from the bound", len(log.admitted), log.asked(-1, 0, end), end, log.slowest, where, over)
	if over > 0 {
		t.Errorf("the regions together admitted %.1f more than the limit allows over %s", over, where)
	}
	// After each move, the busy region's share within 2T + RTT.
	for _, m := range []struct {
		region   int
		from, to time.Duration
	}{{0, move1, move2}, {gRegionAP, move2, cutAt}} {
		from := m.from + gSettle
		got, asked := log.count(m.region, from, m.to), log.asked(m.region, from, m.to)
		want := 0.95 * min(gRate*(m.to-from).Seconds(), float64(asked))
		t.Logf("%s from %v to %v: admitted %d, asked %d (95%% of min(limit, asked): %.0f)", names[m.region], from, m.to, got, asked, want)
		if float64(got) < want {
			t.Errorf("%s admitted %d from %v to %v, want >= %.0f: the share did not follow the demand within 2T + RTT", names[m.region], got, from, m.to, want)
		}
	}
	// The cut: ap at its own share once its lease ended; eu with the rest.
	apFrom := cutAt + gLease + gPeriod/4
	apGot := log.count(gRegionAP, apFrom, heal)
	apMax := 0.33 * gRate * (1 + (heal - apFrom).Seconds())
	euFrom := cutAt + gLease + gSettle
	euGot, euAsked := log.count(0, euFrom, heal), log.asked(0, euFrom, heal)
	euWant := 0.95 * min(0.67*gRate*(heal-euFrom).Seconds(), float64(euAsked))
	t.Logf("cut off: ap admitted %d from %v to %v (its own share allows %.0f); eu admitted %d from %v (95%% of the rest: %.0f)", apGot, apFrom, heal, apMax, euGot, euFrom, euWant)
	if float64(apGot) > apMax {
		t.Errorf("ap, cut off, admitted %d from %v to %v, more than its own share allows (%.0f)", apGot, apFrom, heal, apMax)
	}
	if float64(euGot) < euWant {
		t.Errorf("eu admitted %d from %v to %v while ap was cut off, want >= %.0f", euGot, euFrom, heal, euWant)
	}
}

// gLog is every check's answer, on the test's clock.
type gLog struct {
	mu       sync.Mutex
	admitted []gEvent
	all      []gEvent
	slowest  time.Duration
	failed   atomic.Int64
}

type gEvent struct {
	at     time.Duration // the answer
	region int
}

// runDemand sends each phase's busy regions gDemand checks a second for one
// user, until end; at each of marks it calls mark first.
func runDemand(t *testing.T, bases [][]string, phases []gPhase, end time.Duration, mark func(time.Duration), marks []time.Duration) *gLog {
	t.Helper()
	log := &gLog{}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 5 * time.Second}
	type job struct{ region, n int }
	jobs := make(chan job, 256)
	var wg sync.WaitGroup
	t0 := time.Now()
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				sent := time.Since(t0)
				resp, err := client.Post(bases[j.region][j.n%len(bases[j.region])]+"/v1/check", "application/json", strings.NewReader(`{"attributes":{"user":"alice"}}`))
				if err != nil {
					log.failed.Add(1)
					continue
				}
				var body strings.Builder
				buf := make([]byte, 512)
				for {
					n, err := resp.Body.Read(buf)
					body.Write(buf[:n])
					if err != nil {
						break
					}
				}
				resp.Body.Close()
				at := time.Since(t0)
				e := gEvent{at: at, region: j.region}
				log.mu.Lock()
				log.all = append(log.all, e)
				if strings.Contains(body.String(), `"allowed":true`) {
					log.admitted = append(log.admitted, e)
					log.slowest = max(log.slowest, at-sent)
				}
				log.mu.Unlock()
			}
		}()
	}
	tick := 20 * time.Millisecond
	perTick := gDemand * tick.Seconds()
	credit := make([]float64, len(bases))
	next, sentN := 0, 0
	for now := time.Duration(0); now < end; now = time.Since(t0) {
		for next < len(marks) && now >= marks[next] {
			mark(marks[next])
			next++
		}
		busy := phases[0].busy
		for _, p := range phases {
			if now >= p.at {
				busy = p.busy
			}
		}
		for _, r := range busy {
			credit[r] += perTick
			for ; credit[r] >= 1; credit[r]-- {
				sentN++
				select {
				case jobs <- job{r, sentN}:
				default: // the callers are behind: the demand is what was sent
				}
			}
		}
		time.Sleep(tick - (time.Since(t0) % tick))
	}
	close(jobs)
	wg.Wait()
	if n := log.failed.Load(); n > 0 {
		t.Errorf("%d checks failed", n)
	}
	sort.Slice(log.admitted, func(i, j int) bool { return log.admitted[i].at < log.admitted[j].at })
	return log
}

// perSecond tabulates each second's admissions by region.
func (l *gLog) perSecond(end time.Duration, regions int) string {
	var b strings.Builder
	for s := time.Duration(0); s < end; s += time.Second {
		fmt.Fprintf(&b, "%3.0fs", s.Seconds())
		for r := range regions {
			fmt.Fprintf(&b, " %4d", l.count(r, s, s+time.Second))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// count is region's admissions in [from, to); region -1 is every region.
func (l *gLog) count(region int, from, to time.Duration) int {
	return countEvents(l.admitted, region, from, to)
}

// asked is region's answered checks in [from, to).
func (l *gLog) asked(region int, from, to time.Duration) int {
	return countEvents(l.all, region, from, to)
}

func countEvents(es []gEvent, region int, from, to time.Duration) int {
	n := 0
	for _, e := range es {
		if (region < 0 || e.region == region) && e.at >= from && e.at < to {
			n++
		}
	}
	return n
}

// worstInterval is the most the admissions of any interval exceed
// burst + rate x (its length + the slowest answer), and where.
func (l *gLog) worstInterval(burst, rate float64) (float64, string) {
	widen := l.slowest.Seconds()
	worst, where := -burst, "none"
	// For admissions i <= j: (j-i+1) - rate*(t_j - t_i) is greatest for
	// the i that minimises i - rate*t_i.
	best, bestAt := 0.0, 0
	for j, e := range l.admitted {
		v := float64(j) - rate*e.at.Seconds()
		if j == 0 || v < best {
			best, bestAt = v, j
		}
		n := float64(j-bestAt) + 1
		span := (e.at - l.admitted[bestAt].at).Seconds()
		if ex := n - burst - rate*(span+widen); ex > worst {
			worst = ex
			where = fmt.Sprintf("%d admitted from %v to %v", j-bestAt+1, l.admitted[bestAt].at.Round(time.Millisecond), e.at.Round(time.Millisecond))
		}
	}
	return worst, where
}

// A global rule's region keeps its part of each key in a Redis its
// processes share: `serve` with the embedded store and --global-home is
// refused, since two such processes would each hold the region's share.
func TestAGlobalRuleNeedsARedisPerRegion(t *testing.T) {
	rules := proctest.WriteRules(t, globalRules)
	code, out, errOut := proctest.RunOutput(t, "serve", "--config", rules, "--listen", "127.0.0.1:0", "--region", "eu", "--global-home", "redis://127.0.0.1:1")
	if code != 2 || !strings.Contains(errOut+out, "--global-home needs --store redis://") {
		t.Fatalf("serve with the embedded store and --global-home: exit %d, %q %q; want 2 and the reason", code, out, errOut)
	}
}
