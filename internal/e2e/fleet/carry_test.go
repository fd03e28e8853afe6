package fleet

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testkit/proctest"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// A key's limit changed while it has used part of its window keeps what it
// used: two serve processes on one Redis (and one process on the embedded
// store), a rule of 3 per 10 minutes under GCRA and under the sliding log,
// 64 callers spread over the processes. A key that used 3 and is raised to
// 6 through one process is admitted exactly 3 more through both; lowered
// to 2, none; 6 used under a raise that is removed or expires, none more
// under the rule's 3; the rule file reloaded with 6, then with 3 again, the
// same. The answers that missed the store's deadline on a busy machine are
// degraded (docs/redis.md) and counted apart.
func TestAKeyKeepsWhatItSpentWhenItsLimitChangesEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	const file = `rules:
  - {id: per-user, match: {path: /gcra}, key: [user], rate: %[1]d, per: 10m}
  - {id: per-user-log, match: {path: /log}, key: [user], rate: %[1]d, per: 10m, algorithm: sliding-log}
`
	for _, store := range []string{"redis", "embedded"} {
		t.Run(store, func(t *testing.T) {
			rules := proctest.WriteRules(t, fmt.Sprintf(file, 3))
			args := []string{"serve", "--listen", "127.0.0.1:0", "--watch", "0", "--config", rules}
			n := 1
			if store == "redis" {
				redistest.Need(t)
				args, n = append(args, "--store", redistest.Start(t).URL()), 2
			}
			var bases []string
			var cmds []*os.Process
			for range n {
				b, cmd := start(t, args...)
				bases, cmds = append(bases, b), append(cmds, cmd.Process)
			}
			proctest.WaitHealthy(t, bases)
			via := func(i int) string { return bases[i%len(bases)] }

			for _, c := range []struct{ path, rule string }{{"/gcra", "per-user"}, {"/log", "per-user-log"}} {
				// admits checks 1,000 times for user from 64 callers over
				// every process and wants exactly want admitted.
				admits := func(what, user string, want int64) {
					t.Helper()
					o := proctest.Load(t, bases, c.path, c.rule+"-"+user, 1000)
					if o.Admitted < want-o.Degraded || o.Admitted > want+o.DegradedAdmitted {
						t.Errorf("%s %s: %d of 1,000 admitted, want %d (degraded answers %d, %d of them admitted)", c.rule, what, o.Admitted, want, o.Degraded, o.DegradedAdmitted)
					}
				}
				set := func(through int, user string, rate int, more ...string) string {
					t.Helper()
					args := append([]string{"override", "set", "--url", via(through), "--rule", c.rule, "--key-value", "user=" + c.rule + "-" + user,
						"--action", "limit", "--rate", fmt.Sprint(rate), "--per", "10m", "--reason", "test"}, more...)
					if len(more) == 0 {
						args = append(args, "--for", "1h")
					}
					code, out, errOut := runSluice(t, args...)
					if code != 0 {
						t.Fatalf("sluice %v: exit %d: %s", args, code, errOut)
					}
					id := strings.Fields(out)[1]
					inForceEverywhere(t, bases, id, "limit")
					return id
				}

				admits("used 3", "raised", 3)
				set(0, "raised", 6)
				admits("3 used, raised to 6 through one process", "raised", 3)

				admits("used 3", "lowered", 3)
				set(1, "lowered", 2)
				admits("3 used, lowered to 2 through the other", "lowered", 0)

				removed := set(0, "removed", 6)
				admits("raised to 6", "removed", 6)
				if code, _, errOut := runSluice(t, "override", "rm", "--url", via(1), removed, "--reason", "test"); code != 0 {
					t.Fatalf("sluice override rm: exit %d: %s", code, errOut)
				}
				inForceEverywhere(t, bases, removed, "")
				admits("6 used, the raise removed (back to 3)", "removed", 0)

				expired := set(1, "expired", 6, "--for", "2s")
				admits("raised to 6 for 2 s", "expired", 6)
				inForceEverywhere(t, bases, expired, "")
				admits("6 used, the raise expired (back to 3)", "expired", 0)
			}

			// The rule file reloaded with 6, then with 3 again (SIGHUP).
			reload := func(rate int) {
				t.Helper()
				before := rulesVersion(t, bases[0])
				if err := os.WriteFile(rules, []byte(fmt.Sprintf(file, rate)), 0o600); err != nil {
					t.Fatal(err)
				}
				for _, p := range cmds {
					p.Signal(syscall.SIGHUP)
				}
				for _, b := range bases {
					for deadline := time.Now().Add(10 * time.Second); rulesVersion(t, b) == before; time.Sleep(5 * time.Millisecond) {
						if time.Now().After(deadline) {
							t.Fatalf("%s did not reload its rules 10 s after SIGHUP", b)
						}
					}
				}
			}
			for _, c := range []struct{ path, rule string }{{"/gcra", "per-user"}, {"/log", "per-user-log"}} {
				if o := proctest.Load(t, bases, c.path, "reloaded", 1000); o.Admitted != 3 && o.Degraded == 0 {
					t.Fatalf("%s before the reload: %d admitted, want 3", c.rule, o.Admitted)
				}
			}
			reload(6)
			for _, c := range []struct{ path, rule string }{{"/gcra", "per-user"}, {"/log", "per-user-log"}} {
				if o := proctest.Load(t, bases, c.path, "reloaded", 1000); o.Admitted < 3-o.Degraded || o.Admitted > 3+o.DegradedAdmitted {
					t.Errorf("%s: 3 used, the rule file reloaded with 6: %d admitted, want 3", c.rule, o.Admitted)
				}
			}
			reload(3)
			for _, c := range []struct{ path, rule string }{{"/gcra", "per-user"}, {"/log", "per-user-log"}} {
				if o := proctest.Load(t, bases, c.path, "reloaded", 1000); o.Admitted > o.DegradedAdmitted {
					t.Errorf("%s: 6 used, the rule file reloaded with 3 again: %d admitted, want 0", c.rule, o.Admitted)
				}
			}
		})
	}
}

// inForceEverywhere waits until every process has override id with action
// in force ("" for none).
func inForceEverywhere(t *testing.T, bases []string, id, action string) {
	t.Helper()
	for _, b := range bases {
		for deadline := time.Now().Add(10 * time.Second); overrideAction(t, b, id) != action; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: override %s not %q 10 s after it was set", b, id, action)
			}
		}
	}
}

// rulesVersion is the version of the rules base serves.
func rulesVersion(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/v1/rules")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.Header.Get("Sluice-Rules-Version")
}

// A process that did not see a limit change still carries its keys' usage,
// for the processes on one Redis share the limits each rule is counted
// under: one started after an override ended, one that reloads its rules 7
// seconds after the other (longer than the copy a moved key leaves behind
// lives), and two restarted with a new rule file.
func TestAProcessThatDidNotSeeAChangeStillCarriesEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	redistest.Need(t)
	const file = "rules:\n  - {id: per-user, key: [user], rate: %d, per: 10m}\n"
	rules := proctest.WriteRules(t, fmt.Sprintf(file, 3))
	args := []string{"serve", "--listen", "127.0.0.1:0", "--watch", "0", "--config", rules, "--store", redistest.Start(t).URL()}
	type proc struct {
		base string
		p    *os.Process
	}
	run := func() proc {
		b, cmd := start(t, args...)
		proctest.WaitHealthy(t, []string{b})
		return proc{b, cmd.Process}
	}
	stop := func(p proc) {
		p.p.Kill()
		p.p.Wait()
	}
	admits := func(what, user string, want int64, through ...proc) {
		t.Helper()
		var bases []string
		for _, p := range through {
			bases = append(bases, p.base)
		}
		o := proctest.Load(t, bases, "/", user, 1000)
		if o.Admitted < want-o.Degraded || o.Admitted > want+o.DegradedAdmitted {
			t.Errorf("%s: %d of 1,000 admitted, want %d (degraded answers %d, %d of them admitted)", what, o.Admitted, want, o.Degraded, o.DegradedAdmitted)
		}
	}
	reload := func(p proc) {
		t.Helper()
		before := rulesVersion(t, p.base)
		p.p.Signal(syscall.SIGHUP)
		for deadline := time.Now().Add(10 * time.Second); rulesVersion(t, p.base) == before; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not reload its rules 10 s after SIGHUP", p.base)
			}
		}
	}
	a, b := run(), run()

	// An override used up and removed; a process started afterwards.
	code, out, errOut := runSluice(t, "override", "set", "--url", a.base, "--rule", "per-user", "--key-value", "user=joined",
		"--action", "limit", "--rate", "6", "--per", "10m", "--for", "1h", "--reason", "test")
	if code != 0 {
		t.Fatalf("sluice override set: exit %d: %s", code, errOut)
	}
	id := strings.Fields(out)[1]
	inForceEverywhere(t, []string{a.base, b.base}, id, "limit")
	admits("raised to 6", "joined", 6, a, b)
	if code, _, errOut := runSluice(t, "override", "rm", "--url", b.base, id, "--reason", "test"); code != 0 {
		t.Fatalf("sluice override rm: exit %d: %s", code, errOut)
	}
	inForceEverywhere(t, []string{a.base, b.base}, id, "")
	stop(b)
	c := run()
	admits("6 used under a removed override of 6, through a process started after it", "joined", 0, c)

	// The rule file raised to 6: one process reloads, the other 7 s later.
	admits("used 3", "skewed", 3, a, c)
	if err := os.WriteFile(rules, []byte(fmt.Sprintf(file, 6)), 0o600); err != nil {
		t.Fatal(err)
	}
	reload(a)
	admits("3 used, raised to 6 through the process that reloaded", "skewed", 3, a)
	time.Sleep(7 * time.Second) // the scenario: the other reloads 7 s later
	admits("6 used, through the process still on 3", "skewed", 0, c)
	reload(c)
	admits("6 used, both on 6", "skewed", 0, a, c)

	// Both restarted with the file back at 3.
	admits("used 6", "restarted", 6, a, c)
	if err := os.WriteFile(rules, []byte(fmt.Sprintf(file, 3)), 0o600); err != nil {
		t.Fatal(err)
	}
	stop(a)
	stop(c)
	a, c = run(), run()
	admits("6 used under 6, both restarted on 3", "restarted", 0, a, c)
}
