// Command loadgen sends the end-to-end tests' checks to running sluice
// processes from 64 callers and prints what each user was answered, as
// JSON. It runs as a process of its own, built without the race detector:
// a load generator inside a test binary built with -race spends most of
// the machine's CPU on its own HTTP client, and the tests are about the
// processes it loads, not about it.
//
// Check i is for user i mod len(users), sent to base (i + caller) mod
// len(bases). With -pause-at K, the generator writes "at K" on stdout
// before check K and waits for a line on stdin; the test may send "slow"
// (checks paced to about a thousand a second, one at a time, as a fault
// goes on) and "fast" at any time, and "go" to go on from the pause.
//
// With -gateway, a check is a request through a gateway instead: GET of
// the path with the user in X-User-Id, admitted when answered 200 and
// refused when 429 (any other answer fails the check). A gateway's answer
// does not say whether it was degraded: the test reads that from the
// gateways' metrics.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// user is what one user got; the first and last are when its first check
// was sent and its last answered (ns since the Unix epoch).
type user struct {
	Admitted, Refused, Degraded, DegradedAdmitted int64
	First, Last                                   int64
}

// result is what the generator prints.
type result struct {
	Users   map[string]*user
	PerBase []int64
	Slowest time.Duration
	Errors  int64
	Error   string // the first error

	mu sync.Mutex
}

// fail counts a check that got no answer.
func (res *result) fail(err error) {
	res.mu.Lock()
	defer res.mu.Unlock()
	if res.Errors++; res.Error == "" {
		res.Error = err.Error()
	}
}

// record counts the answer to a check of user name sent to base b at
// start and answered at now.
func (res *result) record(name string, b int, start, now time.Time, allowed, degraded bool) {
	res.mu.Lock()
	defer res.mu.Unlock()
	u := res.Users[name]
	if u.First == 0 || start.UnixNano() < u.First {
		u.First = start.UnixNano()
	}
	u.Last = max(u.Last, now.UnixNano())
	res.Slowest = max(res.Slowest, now.Sub(start))
	if allowed {
		u.Admitted++
		res.PerBase[b]++
	} else {
		u.Refused++
	}
	if degraded {
		u.Degraded++
		if allowed {
			u.DegradedAdmitted++
		}
	}
}

func main() {
	bases := flag.String("bases", "", "comma-separated base URLs")
	path := flag.String("path", "/", "the checked request's path")
	users := flag.String("users", "", "comma-separated users")
	perUser := flag.Int("per-user", 1, "checks per user")
	callers := flag.Int("callers", 64, "concurrent callers")
	pauseAt := flag.Int("pause-at", -1, "write \"at K\" before check K and wait for a line on stdin")
	gateway := flag.Bool("gateway", false, "send each check as a request through a gateway")
	flag.Parse()
	bs, us := strings.Split(*bases, ","), strings.Split(*users, ",")
	total := len(us) * *perUser
	res := &result{Users: map[string]*user{}, PerBase: make([]int64, len(bs))}
	for _, u := range us {
		res.Users[u] = &user{}
	}
	// Every check passes pace, as a test's callback under a lock would: the
	// pause holds it (every caller waits while the test injects its
	// fault), and so does a paced check for its millisecond.
	var slow atomic.Bool
	var pace sync.Mutex
	resume := make(chan struct{})
	go func() {
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			switch in.Text() {
			case "slow":
				slow.Store(true)
			case "fast":
				slow.Store(false)
			case "go":
				resume <- struct{}{}
			}
		}
	}()
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: *callers}}
	var next atomic.Int64
	var wg sync.WaitGroup
	for g := range *callers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= total {
					return
				}
				pace.Lock()
				if i == *pauseAt {
					fmt.Printf("at %d\n", i)
					<-resume
				}
				if slow.Load() {
					time.Sleep(time.Millisecond)
				}
				pace.Unlock()
				name := us[i%len(us)]
				b := (i + g) % len(bs)
				start := time.Now()
				if *gateway {
					allowed, err := throughGateway(client, bs[b]+*path, name)
					if err != nil {
						res.fail(err)
						continue
					}
					res.record(name, b, start, time.Now(), allowed, false)
					continue
				}
				body := fmt.Sprintf(`{"request":{"path":%q},"attributes":{"user":%q}}`, *path, name)
				req, _ := http.NewRequest("POST", bs[b]+"/v1/check", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				// A check may be sent again if a kept-alive connection
				// closes under it: the transport then retries it.
				req.Header.Set("Idempotency-Key", strconv.Itoa(i))
				resp, err := client.Do(req)
				if err != nil {
					res.fail(err)
					continue
				}
				var v struct{ Allowed, Degraded bool }
				json.NewDecoder(resp.Body).Decode(&v)
				resp.Body.Close()
				res.record(name, b, start, time.Now(), v.Allowed, v.Degraded)
			}
		})
	}
	wg.Wait()
	out, _ := json.Marshal(res)
	fmt.Printf("result %s\n", out)
}

// throughGateway sends one request for user through a gateway: admitted
// (200) or refused (429).
func throughGateway(client *http.Client, url, name string) (bool, error) {
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("X-User-Id", name)
	resp, err := client.Do(req)
	if err != nil {
		return false, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return true, nil
	case http.StatusTooManyRequests:
		return false, nil
	}
	return false, fmt.Errorf("GET %s: %s", url, resp.Status)
}
