package proctest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// What tests ask of running sluice processes: checks from many callers,
// readiness, metrics, and the rules files they load.

// Outcome is what a Load of checks got.
type Outcome struct {
	Admitted, Degraded, Refused int64
	DegradedAdmitted            int64         // admitted by a degraded answer
	Slowest                     time.Duration // the longest a check waited
	PerBase                     []int64       // admitted by each base
}

// Load sends n checks of path for user from 64 callers spread over bases.
func Load(t *testing.T, bases []string, path, user string, n int) Outcome {
	t.Helper()
	o, _ := Spread(t, Checks{Bases: bases, Path: path, Users: []string{user}, PerUser: n})
	return o
}

// Checks are checks for many users, from 64 callers spread over bases: check
// i is for user i mod len(Users), sent to base (i + caller) mod len(Bases).
type Checks struct {
	Bases   []string
	Path    string
	Users   []string
	PerUser int
	// OnPause, if set, runs before check PauseAt is sent, while every
	// caller waits: a test injects its fault there, and may pace the
	// checks that follow (Pacer).
	PauseAt int
	OnPause func(p *Pacer)
	// Gateway sends each check as a GET of Path through a gateway, the
	// user in X-User-Id: admitted on 200, refused on 429 (the answers do
	// not say whether they were degraded).
	Gateway bool
}

// UserOutcome is what one user of Checks was answered, and the time from
// its first check to its last answer.
type UserOutcome struct {
	Admitted, Refused, Degraded, DegradedAdmitted int64
	Span                                          time.Duration
}

// Pacer paces the checks of a running Spread.
type Pacer struct {
	mu sync.Mutex
	w  io.Writer
}

// Slow paces the checks to about a thousand a second, one at a time, so
// that they span a fault; Fast lets them go at full speed again.
func (p *Pacer) Slow() { p.say("slow") }
func (p *Pacer) Fast() { p.say("fast") }

func (p *Pacer) say(cmd string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintln(p.w, cmd)
}

var loadgen struct {
	sync.Once
	bin string
	err error
	out []byte
}

// Spread sends c's checks and returns what they got, in all and by user.
// The checks are sent by a process of its own (package loadgen), built
// without the race detector, so that a test binary built with -race loads
// the processes it tests, not itself.
func Spread(t *testing.T, c Checks) (Outcome, map[string]UserOutcome) {
	t.Helper()
	loadgen.Do(func() {
		loadgen.bin, loadgen.out, loadgen.err = buildCommand("loadgen", "github.com/sluice-rl/sluice/internal/testkit/proctest/loadgen")
	})
	if loadgen.err != nil {
		t.Fatalf("build the load generator: %v\n%s", loadgen.err, loadgen.out)
	}
	pauseAt := -1
	if c.OnPause != nil {
		pauseAt = c.PauseAt
	}
	cmd := exec.Command(loadgen.bin, "-bases", strings.Join(c.Bases, ","), "-path", c.Path,
		"-users", strings.Join(c.Users, ","), "-per-user", strconv.Itoa(c.PerUser), "-pause-at", strconv.Itoa(pauseAt),
		"-gateway="+strconv.FormatBool(c.Gateway))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	p := &Pacer{w: stdin}
	var res struct {
		Users   map[string]struct{ Admitted, Refused, Degraded, DegradedAdmitted, First, Last int64 }
		PerBase []int64
		Slowest time.Duration
		Errors  int64
		Error   string
	}
	lines := bufio.NewScanner(stdout)
	lines.Buffer(nil, 64<<20)
	for lines.Scan() {
		line := lines.Text()
		switch {
		case strings.HasPrefix(line, "at "):
			c.OnPause(p)
			p.say("go")
		case strings.HasPrefix(line, "result "):
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "result ")), &res); err != nil {
				t.Fatalf("the load generator's result: %v", err)
			}
		}
	}
	if res.Users == nil {
		t.Fatalf("the load generator ended without a result: %v", cmd.Wait())
	}
	if res.Errors > 0 {
		t.Errorf("%d checks failed, the first: %s", res.Errors, res.Error)
	}
	o := Outcome{PerBase: res.PerBase, Slowest: res.Slowest}
	users := map[string]UserOutcome{}
	for name, u := range res.Users {
		o.Admitted += u.Admitted
		o.Refused += u.Refused
		o.Degraded += u.Degraded
		o.DegradedAdmitted += u.DegradedAdmitted
		users[name] = UserOutcome{Admitted: u.Admitted, Refused: u.Refused, Degraded: u.Degraded, DegradedAdmitted: u.DegradedAdmitted,
			Span: time.Duration(u.Last - u.First)}
	}
	return o, users
}

// WaitHealthy waits until every base says it is ready with closed breakers.
func WaitHealthy(t *testing.T, bases []string) {
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

// WaitGateways waits until every base counts n gateways sharing the store.
func WaitGateways(t *testing.T, bases []string, n int) {
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

// WriteRules writes a rules file of src in the test's temporary directory
// and returns its path.
func WriteRules(t *testing.T, src string) string {
	p := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(p, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Readyz answers a base's /readyz.
func Readyz(t *testing.T, base string) (int, string) {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(body)
}

// Metric is ReadMetric for the test's goroutine: an error fails the test.
func Metric(t *testing.T, base, name string) float64 {
	t.Helper()
	v, err := ReadMetric(base, name)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
