package fleet

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testkit/proctest"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// An operator's override, set through any one of three serve processes on
// one Redis (and on a 3-master cluster), is enforced by all three: a raise
// from 100 to 200 a minute, a block, an expiry, a process restarted
// meanwhile, and a Redis that is down, which refuses the change and keeps
// what was in force. 64 callers spread over the three processes; the time
// for every process to have a change in force is printed (not asserted:
// the machines are shared).
func TestOverridesReachEveryServeProcessEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	redistest.Need(t)
	rules := proctest.WriteRules(t, "rules:\n  - {id: per-user, key: [user], rate: 100, per: 1m}\n")
	for _, topo := range []string{"single", "cluster"} {
		t.Run(topo, func(t *testing.T) {
			var srv *redistest.Server
			var url string
			if topo == "single" {
				srv = redistest.Start(t)
				url = srv.URL()
			} else {
				url = redistest.StartCluster(t).URL()
			}
			serve := func() string {
				b, _ := start(t, "serve", "--listen", "127.0.0.1:0", "--watch", "0", "--config", rules, "--store", url)
				return b
			}
			bases := []string{serve(), serve(), serve()}
			proctest.WaitHealthy(t, bases)

			// admitted is what 1,000 checks of user from 64 callers get, and
			// the most over the limit that the rule's refill while they ran
			// and the degraded answers (a call that missed the store's
			// deadline on a busy machine, docs/redis.md) could add.
			var degraded int64 // answers that missed the store, of the last Load
			admitted := func(user string, rate int64) (int64, int64) {
				start := time.Now()
				o := proctest.Load(t, bases, "/", user, 1000)
				degraded = o.Degraded
				return o.Admitted, rate*int64(time.Since(start))/int64(time.Minute) + 1 + o.DegradedAdmitted
			}
			within := func(what string, got, want, slack int64) {
				t.Helper()
				if got < want-degraded || got > want+slack {
					t.Errorf("%s: %d admitted, want %d (up to %d more from the refill while the checks ran and degraded answers)", what, got, want, slack)
				}
			}
			got, slack := admitted("base", 100)
			within("no override", got, 100, slack)

			set := func(via string, args ...string) string {
				t.Helper()
				code, out, errOut := runSluice(t, append([]string{"override", "set", "--url", via}, args...)...)
				if code != 0 {
					t.Fatalf("sluice override set %v: exit %d: %s", args, code, errOut)
				}
				return strings.Fields(out)[1] // "set ID version N: ..."
			}
			// inForce waits until every process has override id with action
			// in force, and returns the time since since.
			inForce := func(id, action string, since time.Time) time.Duration {
				t.Helper()
				for _, b := range bases {
					for deadline := time.Now().Add(10 * time.Second); overrideAction(t, b, id) != action; time.Sleep(5 * time.Millisecond) {
						if time.Now().After(deadline) {
							t.Fatalf("%s: override %s not %q 10 s after it was set", b, id, action)
						}
					}
				}
				return time.Since(since)
			}

			began := time.Now()
			raised := set(bases[0], "--rule", "per-user", "--key-value", "user=vip", "--action", "limit", "--rate", "200", "--per", "1m", "--for", "1h", "--reason", "launch")
			took := inForce(raised, "limit", began)
			got, slack = admitted("vip", 200)
			within("raised to 200 a minute", got, 200, slack)
			t.Logf("%s: the raise was in force in all three processes %v after `sluice override set` was started on one", topo, took.Round(time.Millisecond))

			code, _, errOut := runSluice(t, "override", "set", "--url", bases[1], "--rule", "per-user", "--key-value", "user=vip", "--action", "block", "--until-removed", "--reason", "abuse")
			if code == 0 || !strings.Contains(errOut, "428") {
				t.Fatalf("a blind overwrite of the raise: exit %d, %s; want 428", code, errOut)
			}
			began = time.Now()
			blocked := set(bases[1], "--rule", "per-user", "--key-value", "user=vip", "--action", "block", "--until-removed", "--reason", "abuse", "--version", fmt.Sprint(overrideVersion(t, bases[1], raised)))
			took = inForce(blocked, "block", began)
			if got, _ := admitted("vip", 0); got != 0 {
				t.Errorf("blocked: %d admitted", got)
			}
			t.Logf("%s: the block was in force in all three %v after the command was started on another", topo, took.Round(time.Millisecond))

			short := set(bases[2], "--rule", "per-user", "--key-value", "user=brief", "--action", "exempt", "--for", "2s", "--reason", "a short test")
			inForce(short, "exempt", time.Now())
			if got, _ := admitted("brief", 0); got != 1000 {
				t.Errorf("exempt: %d of 1,000 admitted", got)
			}
			inForce(short, "", time.Now()) // expired
			got, slack = admitted("brief", 100)
			within("after the exemption expired", got, 100, slack)

			bases[2] = serve() // a process started meanwhile reads what is in force
			proctest.WaitHealthy(t, bases[2:])
			if a := overrideAction(t, bases[2], blocked); a != "block" {
				t.Fatalf("a process started after the block: %q in force", a)
			}
			if got, _ := admitted("vip", 0); got != 0 {
				t.Errorf("blocked, with a restarted process: %d admitted", got)
			}

			if srv == nil {
				return
			}
			// A hung Redis: the changes are refused, not waited for, and
			// never made when it wakes (what it had queued meanwhile runs
			// then, and must refuse to).
			version := setVersion(t, bases[0])
			srv.Pause()
			code, _, errOut = runSluice(t, "override", "set", "--url", bases[0], "--rule", "per-user", "--key-value", "user=other", "--action", "exempt", "--for", "1h", "--reason", "x")
			rmCode, _, rmOut := runSluice(t, "override", "rm", "--url", bases[1], blocked, "--reason", "x")
			srv.Resume()
			for _, c := range []struct {
				code int
				out  string
			}{{code, errOut}, {rmCode, rmOut}} {
				if c.code == 0 || !strings.Contains(c.out, "503") || !strings.Contains(c.out, "nothing changed") {
					t.Fatalf("a change while Redis hangs: exit %d, %s; want a clear 503", c.code, c.out)
				}
			}
			time.Sleep(time.Second) // what Redis had queued has run, and been told
			for _, b := range bases {
				if v := setVersion(t, b); v != version {
					t.Fatalf("%s: the overrides' version went %d -> %d after Redis woke: a change refused with 503 was made", b, version, v)
				}
			}
			srv.Stop()
			code, _, errOut = runSluice(t, "override", "set", "--url", bases[0], "--rule", "per-user", "--key-value", "user=other", "--action", "exempt", "--for", "1h", "--reason", "x")
			if code == 0 || !strings.Contains(errOut, "503") || !strings.Contains(errOut, "nothing changed") {
				t.Fatalf("a change while Redis is down: exit %d, %s; want a clear 503", code, errOut)
			}
			for _, b := range bases {
				if a := overrideAction(t, b, blocked); a != "block" {
					t.Fatalf("%s, Redis down: the block is %q", b, a)
				}
			}
			if got, _ := admitted("vip", 0); got != 0 {
				t.Errorf("blocked, Redis down: %d admitted", got)
			}
		})
	}
}

// runSluice runs the built binary and returns its exit code, stdout and
// stderr.
func runSluice(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	return proctest.RunOutput(t, args...)
}

// overrideAction is the action of override id in force at base ("" if none).
func overrideAction(t *testing.T, base, id string) string {
	o := override(t, base, id)
	if o == nil {
		return ""
	}
	return o.Action
}

// setVersion is the version of the overrides in force at base.
func setVersion(t *testing.T, base string) int64 {
	t.Helper()
	resp, err := http.Get(base + "/v1/overrides")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct{ Version int64 }
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatal(err)
	}
	return list.Version
}

func overrideVersion(t *testing.T, base, id string) int64 {
	o := override(t, base, id)
	if o == nil {
		t.Fatalf("%s: no override %s", base, id)
	}
	return o.Version
}

func override(t *testing.T, base, id string) *struct {
	Action  string
	Version int64
} {
	t.Helper()
	resp, err := http.Get(base + "/v1/overrides/" + id)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil
	}
	var o struct {
		Action  string
		Version int64
	}
	if err := json.NewDecoder(resp.Body).Decode(&o); err != nil {
		t.Fatal(err)
	}
	return &o
}
