package fleet

import (
	"encoding/json"
	"fmt"
	"github.com/sluice-rl/sluice/internal/proctest"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// faultRules: one fail-open and one fail-closed rule of 100 per hour per
// user.
const faultRules = `
rules:
  - {id: open, match: {path: /open}, key: [user], rate: 100, per: 1h}
  - {id: closed, match: {path: /closed}, key: [user], rate: 100, per: 1h, failMode: closed}
`

// The bound a request waits for a failed store: the adaptive deadline's cap
// (250 ms), plus room for a loaded machine and its HTTP round trip.
const answerBound = 2 * time.Second

type outcome struct {
	admitted, degraded, refused int64
	slowest                     time.Duration
	perBase                     []int64
}

// load sends n checks of path for user from 64 callers spread over bases.
func load(t *testing.T, bases []string, path, user string, n int) outcome {
	body := fmt.Sprintf(`{"request":{"path":%q},"attributes":{"user":%q}}`, path, user)
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	o := outcome{perBase: make([]int64, len(bases))}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	for g := range 64 {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				b := (int(i) + g) % len(bases)
				start := time.Now()
				req, _ := http.NewRequest("POST", bases[b]+"/v1/check", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				// A check may be sent again if a kept-alive connection closes
				// under it: the client's transport then retries it.
				req.Header.Set("Idempotency-Key", strconv.Itoa(int(i)))
				resp, err := client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				var v struct{ Allowed, Degraded bool }
				json.NewDecoder(resp.Body).Decode(&v)
				resp.Body.Close()
				took := time.Since(start)
				mu.Lock()
				o.slowest = max(o.slowest, took)
				if v.Allowed {
					o.admitted++
					o.perBase[b]++
				} else {
					o.refused++
				}
				if v.Degraded {
					o.degraded++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return o
}

// waitHealthy waits until every base says it is ready with closed breakers.
func waitHealthy(t *testing.T, bases []string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, b := range bases {
		for {
			resp, err := http.Get(b + "/readyz")
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 && strings.HasPrefix(string(body), "ready\n") && !strings.Contains(string(body), "open") {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never became healthy again", b)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// waitGateways waits until every base counts n gateways sharing the store.
func waitGateways(t *testing.T, bases []string, n int) {
	t.Helper()
	want := fmt.Sprintf("sluice_gateways %d\n", n)
	deadline := time.Now().Add(20 * time.Second)
	for _, b := range bases {
		for {
			resp, err := http.Get(b + "/metrics")
			if err == nil {
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if strings.Contains(string(body), want) {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never counted %d gateways", b, n)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func writeRules(t *testing.T, src string) string {
	p := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// assertDegraded checks a store failure's answers: every request answered
// within the bound, fail-open admitting at most the limit's share per
// gateway, fail-closed refusing all.
func assertDegraded(t *testing.T, what string, bases []string, user string) {
	t.Helper()
	open := load(t, bases, "/open", user, 300)
	share := int64(100 / len(bases))
	for i, n := range open.perBase {
		if n > share {
			t.Errorf("%s: gateway %d admitted %d on a fail-open rule, more than its share %d", what, i, n, share)
		}
	}
	if open.slowest > answerBound {
		t.Errorf("%s: a request waited %v, over the bound %v", what, open.slowest, answerBound)
	}
	closed := load(t, bases, "/closed", user, 100)
	if closed.admitted != 0 {
		t.Errorf("%s: a fail-closed rule admitted %d", what, closed.admitted)
	}
	if closed.slowest > answerBound {
		t.Errorf("%s: a request waited %v, over the bound %v", what, closed.slowest, answerBound)
	}
	t.Logf("%s: fail-open admitted %v (share %d each), fail-closed admitted %d of 100, slowest answer %v",
		what, open.perBase, share, closed.admitted, max(open.slowest, closed.slowest))
}

// assertExact checks that counting is exact: 100 of 300 for a fresh user,
// no degraded answer.
func assertExact(t *testing.T, what string, bases []string, user string) {
	t.Helper()
	o := load(t, bases, "/open", user, 300)
	if o.admitted != 100 || o.degraded != 0 {
		t.Errorf("%s: admitted %d of 300 (%d degraded), want exactly 100", what, o.admitted, o.degraded)
	}
}

// Faults through the built binary with default settings: two `sluice serve`
// processes on one Redis reached through a TCP proxy. Slowed by 3 and 20 ms
// it stays exact; slowed by 200 ms, hung (SIGSTOP), killed and restarted
// empty, every request is still answered within the bound, fail-open rules
// admit at most their share per gateway, fail-closed rules refuse, and
// counting is exact again once Redis is back.
func TestServeUnderRedisFaultsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	rules := writeRules(t, faultRules)
	var bases []string
	for range 2 {
		b, _ := start(t, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--config", rules, "--store", "redis://"+proxy.Addr)
		bases = append(bases, b)
	}
	waitHealthy(t, bases)
	waitGateways(t, bases, 2)
	assertExact(t, "healthy", bases, "u-healthy")

	for _, d := range []time.Duration{3 * time.Millisecond, 20 * time.Millisecond} {
		proxy.SetDelay(d)
		load(t, bases, "/open", fmt.Sprint("warm-", d), 64) // the deadline learns the new latency...
		waitHealthy(t, bases)                               // ...and a breaker the warm-up opened closes
		assertExact(t, fmt.Sprintf("slowed by %v", d), bases, fmt.Sprint("u-slow-", d))
	}
	proxy.SetDelay(200 * time.Millisecond)
	assertDegraded(t, "slowed by 200ms", bases, "u-slow-200ms")
	proxy.SetDelay(0)
	waitHealthy(t, bases)
	assertExact(t, "after the slowdown", bases, "u-after-slow")

	srv.Pause()
	assertDegraded(t, "hung (SIGSTOP)", bases, "u-hung")
	srv.Resume()
	waitHealthy(t, bases)
	assertExact(t, "resumed", bases, "u-resumed")

	srv.Stop()
	assertDegraded(t, "killed", bases, "u-killed")
	resp, err := http.Get(bases[0] + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || !strings.Contains(string(body), "closed") {
		t.Errorf("readyz with Redis down: %d %s", resp.StatusCode, body)
	}
	srv.Restart() // empty: scripts and counts lost
	waitHealthy(t, bases)
	assertExact(t, "restarted empty", bases, "u-restarted")
}

// A gateway whose Redis is down at boot says so at once (a WARN line with
// the URL, its password hidden), starts, serves degraded within its share,
// is not ready until the store has answered once (a typo in --store must
// not pass a deployment's readiness check), and switches to Redis when it
// comes. With --require-store it exits instead.
func TestServeBootsWithoutRedisEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	srv := redistest.Start(t)
	srv.Stop()
	rules := writeRules(t, "rules:\n  - {id: open, key: [user], rate: 3, per: 1h}\n")
	url := strings.Replace(srv.URL(), "redis://", "redis://:hunter2@", 1)
	code, errs := run(t, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--config", rules, "--store", url, "--require-store")
	if code != 1 || !strings.Contains(errs, "does not answer") || strings.Contains(errs, "hunter2") {
		t.Errorf("--require-store without Redis: exit %d, %q", code, errs)
	}
	var log proctest.Output
	base, _ := startTo(t, &log, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--config", rules, "--store", url)
	// The log is copied from the process's stderr as it comes: wait for it.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(log.String(), "does not answer") && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if l := log.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "does not answer") || !strings.Contains(l, srv.Addr) || strings.Contains(l, "hunter2") {
		t.Errorf("the log at boot without Redis names no store, or its password:\n%s", l)
	}
	readyz := func() (int, string) { return readyzOf(t, base) }
	if code, body := readyz(); code != 503 || !strings.Contains(body, "has not answered since") || !strings.Contains(body, "not connected") {
		t.Errorf("readyz at boot without Redis, every rule failing open: %d %s", code, body)
	}
	srv.Restart()
	waitHealthy(t, []string{base})
	if code, body := readyz(); code != 200 {
		t.Errorf("readyz once Redis answers: %d %s", code, body)
	}
	// Once it has answered, a store that goes down is an outage, not a
	// typo: ready, degraded, while every rule fails open.
	srv.Stop()
	if code, body := readyz(); code != 200 || !strings.Contains(body, "degraded") {
		t.Errorf("readyz after Redis went down: %d %s", code, body)
	}
	// The breaker opens, and its line names the store.
	for i := 0; i < 60 && !strings.Contains(log.String(), "store circuit breaker"); i++ {
		http.Post(base+"/v1/check", "application/json", strings.NewReader(`{"attributes":{"user":"b"}}`))
	}
	if l := proctest.Lines(log.String(), "store circuit breaker"); !strings.Contains(l, "node="+strings.Replace(url, "hunter2", "xxxxx", 1)) {
		t.Errorf("the breaker's line does not name the store: %q", l)
	}
	// A password in a cluster or Sentinel URL shows nowhere either: not in
	// the log, /readyz, or the answers API clients get.
	for _, u := range []string{
		"redis-cluster://ops:hunter2@" + srv.Addr,
		"redis-sentinel://ops:hunter2@mymaster@" + srv.Addr,
	} {
		var log proctest.Output
		base, _ := startTo(t, &log, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--config", rules, "--store", u)
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(log.String(), "does not answer") && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		resp, err := http.Post(base+"/v1/check", "application/json", strings.NewReader(`{"attributes":{"user":"c"}}`))
		if err != nil {
			t.Fatal(err)
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		_, ready := readyzOf(t, base)
		if strings.Contains(log.String()+ready+string(answer), "hunter2") || !strings.Contains(string(answer), `"degraded":true`) {
			t.Errorf("%s: a degraded answer %s, or the password shown:\n%s\n%s", u, answer, ready, log.String())
		}
	}
}

// readyzOf answers a base's /readyz.
func readyzOf(t *testing.T, base string) (int, string) {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(body)
}

// The same boot, with fail-closed rules: degraded within its share where
// rules fail open, refusing where they fail closed, and exact once Redis
// comes.
func TestServeBootsWithoutRedisThenExactEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	srv := redistest.Start(t)
	srv.Stop()
	rules := writeRules(t, faultRules)
	base, _ := start(t, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--config", rules, "--store", srv.URL())
	assertDegraded(t, "boot without Redis", []string{base}, "u-boot")
	srv.Restart()
	waitHealthy(t, []string{base})
	assertExact(t, "Redis came", []string{base}, "u-came")
}

// On a 3-master cluster, a stopped master degrades only the keys it owns:
// keys on the other masters stay exact.
func TestServeWithOneClusterMasterStoppedEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	cluster := redistest.StartCluster(t)
	rules := writeRules(t, faultRules)
	var bases []string
	for range 2 {
		b, _ := start(t, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--config", rules, "--store", cluster.URL())
		bases = append(bases, b)
	}
	waitHealthy(t, bases)
	waitGateways(t, bases, 2)
	// Find users whose keys live on master 0 and on another master: master
	// 0 answers a key it does not own with MOVED.
	onNode := func(user string) int {
		r, err := cluster.Nodes[0].Do("GET", "{"+user+"}open:x")
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(r, "-MOVED") {
			return 1
		}
		return 0
	}
	var onDead, onLive []string
	for i := 0; len(onDead) < 2 || len(onLive) < 2; i++ {
		u := fmt.Sprint("user-", i)
		if onNode(u) == 0 {
			onDead = append(onDead, u)
		} else {
			onLive = append(onLive, u)
		}
	}
	cluster.Nodes[0].Stop()
	assertExact(t, "a key on a live master", bases, onLive[0])
	assertDegraded(t, "a key on the stopped master", bases, onDead[0])
	assertExact(t, "another key on a live master", bases, onLive[1])
}

// A Sentinel failover: the primary is killed, the Sentinel promotes the
// replica, and sluice follows it through its redis-sentinel:// URL. While it
// happens every request is answered within the bound and no fail-closed
// rule admits without Redis; afterwards counting is exact on the new
// primary.
func TestServeFollowsASentinelFailoverEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	set := redistest.StartSentinel(t)
	rules := writeRules(t, faultRules)
	base, _ := start(t, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--config", rules, "--store", set.URL())
	waitHealthy(t, []string{base})
	assertExact(t, "before the failover", []string{base}, "u-before")
	set.Primary.Stop()
	deadline := time.Now().Add(60 * time.Second)
	for set.PrimaryAddr() != set.Replica.Addr {
		o := load(t, []string{base}, "/open", "u-during", 64)
		if o.slowest > answerBound {
			t.Errorf("during the failover a request waited %v, over the bound %v", o.slowest, answerBound)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Sentinel never promoted the replica (primary: %q)", set.PrimaryAddr())
		}
		time.Sleep(100 * time.Millisecond)
	}
	waitHealthy(t, []string{base})
	assertExact(t, "after the failover", []string{base}, "u-after")
}
