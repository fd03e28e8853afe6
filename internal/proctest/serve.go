package proctest

import (
	"encoding/json"
	"fmt"
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
	body := fmt.Sprintf(`{"request":{"path":%q},"attributes":{"user":%q}}`, path, user)
	var next atomic.Int64
	var wg sync.WaitGroup
	var mu sync.Mutex
	o := Outcome{PerBase: make([]int64, len(bases))}
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
				o.Slowest = max(o.Slowest, took)
				if v.Allowed {
					o.Admitted++
					o.PerBase[b]++
				} else {
					o.Refused++
				}
				if v.Degraded {
					o.Degraded++
					if v.Allowed {
						o.DegradedAdmitted++
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return o
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
