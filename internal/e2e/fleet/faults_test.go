package fleet

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testkit/proctest"

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

// assertDegraded checks a store failure's answers: every request answered
// within the bound, fail-open admitting at most the limit's share per
// gateway, fail-closed never admitting on a degraded answer. A store that
// is slow, not gone, may still answer some calls in time (the deadline
// follows its latency to the cap, and a starved gateway's own scheduling
// delay is added to it): those answers are the store's own, exact, and
// stand on a fail-closed rule too. answers says whether the store may
// still answer; when it may not, a fail-closed rule admits nothing at all.
func assertDegraded(t *testing.T, what string, bases []string, user string, answers bool) {
	t.Helper()
	open := proctest.Load(t, bases, "/open", user, 300)
	share := int64(100 / len(bases))
	for i, n := range open.PerBase {
		if n > share {
			t.Errorf("%s: gateway %d admitted %d on a fail-open rule, more than its share %d", what, i, n, share)
		}
	}
	if open.Slowest > answerBound {
		t.Errorf("%s: a request waited %v, over the bound %v", what, open.Slowest, answerBound)
	}
	closed := proctest.Load(t, bases, "/closed", user, 100)
	if closed.DegradedAdmitted != 0 || (!answers && closed.Admitted != 0) {
		t.Errorf("%s: a fail-closed rule admitted %d (%d on a degraded answer)", what, closed.Admitted, closed.DegradedAdmitted)
	}
	if closed.Slowest > answerBound {
		t.Errorf("%s: a request waited %v, over the bound %v", what, closed.Slowest, answerBound)
	}
	t.Logf("%s: fail-open admitted %v (share %d each), fail-closed admitted %d of 100 (%d answers degraded), slowest answer %v",
		what, open.PerBase, share, closed.Admitted, closed.Degraded, max(open.Slowest, closed.Slowest))
}

// assertExact checks that counting is exact: 100 of 300 for a fresh user,
// no degraded answer. A degraded answer means a call missed its deadline,
// which a starved machine can cause without any fault of the store's (the
// Redis proxy runs in this test's -race process): such a try is said and
// made again for a fresh user, at most three times. Every try still holds
// the stated bound: over the limit by no more than its degraded
// admissions, under it by no more than its degraded answers. user names
// the fresh user of each try (see fresh).
func assertExact(t *testing.T, what string, bases []string, user func(try int) string) {
	t.Helper()
	for try := 1; ; try++ {
		o := proctest.Load(t, bases, "/open", user(try), 300)
		switch {
		case o.Admitted > 100+o.DegradedAdmitted || o.Admitted < 100-o.Degraded:
			t.Errorf("%s: admitted %d of 300 with %d degraded answers (%d admitted), want 100 within them", what, o.Admitted, o.Degraded, o.DegradedAdmitted)
		case o.Degraded == 0 && o.Admitted != 100:
			t.Errorf("%s: admitted %d of 300, want exactly 100", what, o.Admitted)
		case o.Degraded > 0 && try < exactTries:
			t.Logf("%s: %d degraded answers of 300 (calls past their deadline on a starved machine), %d admitted: again for a fresh user", what, o.Degraded, o.Admitted)
			continue
		case o.Degraded > 0:
			t.Errorf("%s: degraded answers in each of %d tries (%d in the last, %d admitted)", what, exactTries, o.Degraded, o.Admitted)
		}
		return
	}
}

// exactTries bounds assertExact's tries.
const exactTries = 3

// fresh names a user per try: name-1, name-2, ...
func fresh(name string) func(try int) string {
	return func(try int) string { return fmt.Sprintf("%s-%d", name, try) }
}

// Faults through the built binary with default settings: two `sluice serve`
// processes on one Redis reached through a TCP proxy. Slowed by 3 and 20 ms
// it stays exact; slowed by 200 ms, hung (SIGSTOP), killed and restarted
// empty, every request is still answered within the bound, fail-open rules
// admit at most their share per gateway, fail-closed rules refuse every
// request the store does not answer in time (slowed, it may still answer
// some), and counting is exact again once Redis is back.
func TestServeUnderRedisFaultsEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	rules := proctest.WriteRules(t, faultRules)
	var bases []string
	for range 2 {
		b, _ := start(t, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--config", rules, "--store", "redis://"+proxy.Addr)
		bases = append(bases, b)
	}
	proctest.WaitHealthy(t, bases)
	proctest.WaitGateways(t, bases, 2)
	assertExact(t, "healthy", bases, fresh("u-healthy"))

	for _, d := range []time.Duration{3 * time.Millisecond, 20 * time.Millisecond} {
		proxy.SetDelay(d)
		proctest.Load(t, bases, "/open", fmt.Sprint("warm-", d), 64) // the deadline learns the new latency...
		proctest.WaitHealthy(t, bases)                               // ...and a breaker the warm-up opened closes
		assertExact(t, fmt.Sprintf("slowed by %v", d), bases, fresh(fmt.Sprint("u-slow-", d)))
	}
	proxy.SetDelay(200 * time.Millisecond)
	assertDegraded(t, "slowed by 200ms", bases, "u-slow-200ms", true)
	proxy.SetDelay(0)
	proctest.WaitHealthy(t, bases)
	assertExact(t, "after the slowdown", bases, fresh("u-after-slow"))

	srv.Pause()
	assertDegraded(t, "hung (SIGSTOP)", bases, "u-hung", false)
	srv.Resume()
	proctest.WaitHealthy(t, bases)
	assertExact(t, "resumed", bases, fresh("u-resumed"))

	srv.Stop()
	assertDegraded(t, "killed", bases, "u-killed", false)
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
	proctest.WaitHealthy(t, bases)
	assertExact(t, "restarted empty", bases, fresh("u-restarted"))
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
	proctest.Exclusive(t)
	srv := redistest.Start(t)
	srv.Stop()
	rules := proctest.WriteRules(t, "rules:\n  - {id: open, key: [user], rate: 3, per: 1h}\n")
	url := strings.Replace(srv.URL(), "redis://", "redis://:hunter2@", 1)
	code, errs := proctest.Run(t, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--config", rules, "--store", url, "--require-store")
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
	readyz := func() (int, string) { return proctest.Readyz(t, base) }
	if code, body := readyz(); code != 503 || !strings.Contains(body, "has not answered since") || !strings.Contains(body, "not connected") {
		t.Errorf("readyz at boot without Redis, every rule failing open: %d %s", code, body)
	}
	srv.Restart()
	proctest.WaitHealthy(t, []string{base})
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
		_, ready := proctest.Readyz(t, base)
		if strings.Contains(log.String()+ready+string(answer), "hunter2") || !strings.Contains(string(answer), `"degraded":true`) {
			t.Errorf("%s: a degraded answer %s, or the password shown:\n%s\n%s", u, answer, ready, log.String())
		}
	}
}

// The same boot, with fail-closed rules: degraded within its share where
// rules fail open, refusing where they fail closed, and exact once Redis
// comes.
func TestServeBootsWithoutRedisThenExactEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	srv := redistest.Start(t)
	srv.Stop()
	rules := proctest.WriteRules(t, faultRules)
	base, _ := start(t, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--config", rules, "--store", srv.URL())
	assertDegraded(t, "boot without Redis", []string{base}, "u-boot", false)
	srv.Restart()
	proctest.WaitHealthy(t, []string{base})
	assertExact(t, "Redis came", []string{base}, fresh("u-came"))
}

// On a 3-master cluster, a stopped master degrades only the keys it owns:
// keys on the other masters stay exact.
func TestServeWithOneClusterMasterStoppedEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	cluster := redistest.StartCluster(t)
	rules := proctest.WriteRules(t, faultRules)
	var bases []string
	for range 2 {
		b, _ := start(t, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--config", rules, "--store", cluster.URL())
		bases = append(bases, b)
	}
	proctest.WaitHealthy(t, bases)
	proctest.WaitGateways(t, bases, 2)
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
	for i := 0; len(onDead) < 1 || len(onLive) < 2*exactTries; i++ {
		u := fmt.Sprint("user-", i)
		if onNode(u) == 0 {
			onDead = append(onDead, u)
		} else {
			onLive = append(onLive, u)
		}
	}
	cluster.Nodes[0].Stop()
	assertExact(t, "a key on a live master", bases, func(try int) string { return onLive[try-1] })
	assertDegraded(t, "a key on the stopped master", bases, onDead[0], false)
	assertExact(t, "another key on a live master", bases, func(try int) string { return onLive[exactTries+try-1] })
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
	proctest.Exclusive(t)
	set := redistest.StartSentinel(t)
	rules := proctest.WriteRules(t, faultRules)
	base, _ := start(t, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--config", rules, "--store", set.URL())
	proctest.WaitHealthy(t, []string{base})
	assertExact(t, "before the failover", []string{base}, fresh("u-before"))
	set.Primary.Stop()
	deadline := time.Now().Add(60 * time.Second)
	for set.PrimaryAddr() != set.Replica.Addr {
		o := proctest.Load(t, []string{base}, "/open", "u-during", 64)
		if o.Slowest > answerBound {
			t.Errorf("during the failover a request waited %v, over the bound %v", o.Slowest, answerBound)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Sentinel never promoted the replica (primary: %q)", set.PrimaryAddr())
		}
		time.Sleep(100 * time.Millisecond)
	}
	proctest.WaitHealthy(t, []string{base})
	assertExact(t, "after the failover", []string{base}, fresh("u-after"))
}
