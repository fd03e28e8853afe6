package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testkit/nginxtest"
)

// An upstream closes a keep-alive connection it found idle for its
// keepalive timeout (nginx's keepalive_timeout: 75 s by default, often
// 1-5 s; Node 5 s; gunicorn 2 s). A gateway that sends a request on such a
// pooled connection reads no answer: it must notice and send the request
// on a fresh connection, never answer 502. Here real nginx closes after
// 500 ms idle, and rounds of 20 concurrent clients (keep-alive and
// one-shot) send GET, HEAD and POST with bodies, with idle gaps around
// that timeout between rounds: 1,200 requests on each gateway plane, and
// every one answered 200 on the fasthttp plane (the default), which looks
// at a pooled connection before it writes on it. net/http notices a close
// by reading idle connections in the background: a POST written within
// 50 ms of the upstream's timeout on a starved machine may meet the
// close, and is not sent again (it is not idempotent); every other request
// is answered 200 there too.
func TestGatewaysDoNotAnswer502WhenTheUpstreamClosedAnIdleConnection(t *testing.T) {
	if testing.Short() {
		t.Skip("runs nginx and idles between rounds")
	}
	upstream := nginxtest.Upstream(t, 500*time.Millisecond)
	const src = "rules:\n  - id: all\n    key: [ip]\n    rate: 1000000\n    per: 1s\n"
	gaps := []time.Duration{450, 500, 520, 550, 600, 700, 480, 510, 530, 800, 505, 1100}
	for _, p := range testPlanes {
		if !p.gateway {
			continue
		}
		t.Run(p.name, func(t *testing.T) {
			base, _ := p.start(t, upstream, src, Options{})
			keepAlive := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second}
			oneShot := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
			var sent, bad, raced atomic.Int64
			var mu sync.Mutex
			var first []string
			for round, gap := range gaps {
				time.Sleep(gap * time.Millisecond)
				var wg sync.WaitGroup
				for c := range 20 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						client := keepAlive
						if c%4 == 3 {
							client = oneShot
						}
						for i := range 5 {
							var req *http.Request
							switch (c + i) % 3 {
							case 0:
								req, _ = http.NewRequest("GET", base+"/get", nil)
							case 1:
								req, _ = http.NewRequest("HEAD", base+"/head", nil)
							default:
								req, _ = http.NewRequest("POST", base+"/post", strings.NewReader(strings.Repeat("b", 100*(i+1))))
								req.Header.Set("Content-Type", "text/plain")
							}
							sent.Add(1)
							resp, err := client.Do(req)
							status := 0
							if err == nil {
								io.Copy(io.Discard, resp.Body)
								resp.Body.Close()
								status = resp.StatusCode
							}
							if status != http.StatusOK && p.name == "net-http" && req.Method == "POST" && gap >= 450 && gap <= 550 {
								// net/http notices a close from its background
								// read of the idle connection; a request written
								// within 10% of the upstream's timeout, on a
								// starved machine, may meet the close and, not
								// being idempotent, is not sent again
								// (docs/http.md).
								raced.Add(1)
							} else if status != http.StatusOK {
								bad.Add(1)
								mu.Lock()
								if len(first) < 5 {
									first = append(first, fmt.Sprintf("round %d (after %dms idle): %s %s: %d %v", round, gap, req.Method, req.URL.Path, status, err))
								}
								mu.Unlock()
							}
						}
					}()
				}
				wg.Wait()
			}
			if bad.Load() > 0 {
				t.Errorf("%d of %d requests not answered 200 with the upstream closing idle connections after 500ms; first: %s", bad.Load(), sent.Load(), strings.Join(first, "; "))
			}
			t.Logf("%d requests, %d not 200 (and %d POSTs on net/http sent as the upstream closed)", sent.Load(), bad.Load(), raced.Load())
		})
	}
}

// The keep-alive an upstream announces shortens how long its idle
// connections are kept: a second less than it says, or a quarter less
// for a short one; never longer than the gateway's own limit.
func TestAnAnnouncedKeepAliveShortensTheIdleLimit(t *testing.T) {
	u := &upstreamConns{idle: DefaultUpstreamIdle}
	if got := u.keepFor(); got != DefaultUpstreamIdle {
		t.Fatalf("nothing announced: kept %v, want %v", got, DefaultUpstreamIdle)
	}
	for _, c := range []struct {
		field string
		want  time.Duration
	}{
		{"timeout=2, max=100", 1500 * time.Millisecond},
		{"max=100, Timeout = 3", 2250 * time.Millisecond},
		{"timeout=8", DefaultUpstreamIdle}, // 7 s, but never past the gateway's own limit
		{"timeout=60", DefaultUpstreamIdle},
		{"timeout=1", 750 * time.Millisecond},
		{"timeout=0", 750 * time.Millisecond},           // ignored: the last announcement stands
		{"timeout=abc", 750 * time.Millisecond},         // ignored
		{"timeout=99999999999", 750 * time.Millisecond}, // ignored: out of range
	} {
		u.announce([]byte(c.field))
		if got := u.keepFor(); got != c.want {
			t.Errorf("after %q: kept %v, want %v", c.field, got, c.want)
		}
	}
}

// closingUpstream answers the first request on each connection (after
// firstDelay, so that concurrent requests open connections of their own)
// and, once trap is set, reads any later request on a connection and closes
// it unanswered: the instant an idle timer fires as a request is written.
// With broken set it closes every request unanswered. It counts the
// connections it accepted.
type closingUpstream struct {
	ln           net.Listener
	trap, broken atomic.Bool
	accepted     atomic.Int64
}

func newClosingUpstream(t *testing.T, firstDelay time.Duration) *closingUpstream {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &closingUpstream{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.accepted.Add(1)
			go u.serve(c, firstDelay)
		}
	}()
	return u
}

func (u *closingUpstream) serve(c net.Conn, firstDelay time.Duration) {
	defer c.Close()
	br := bufio.NewReader(c)
	for n := 0; ; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		if u.broken.Load() || (n > 0 && u.trap.Load()) {
			return
		}
		if n == 0 {
			time.Sleep(firstDelay)
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	}
}

// A request written on a pooled connection as the upstream closes it gets
// no answer byte. Both planes send it again, as net/http's transport does,
// if it may be sent twice (GET) and the connection was a reused one, on
// every pooled connection that fails so until a new one answers: a starved
// machine can find several pooled connections closing at once. A POST is
// not sent twice (502), and a new connection that fails means a failing
// upstream: answered 502 after that one connection, not retried.
func TestARequestMeetingAnUpstreamCloseGoesAgainOnlyWhenThatIsSafe(t *testing.T) {
	const src = "rules:\n  - id: all\n    key: [ip]\n    rate: 1000000\n    per: 1s\n"
	const pooled = 10
	for _, p := range testPlanes {
		if !p.gateway {
			continue
		}
		t.Run(p.name, func(t *testing.T) {
			up := newClosingUpstream(t, 100*time.Millisecond)
			base, _ := p.start(t, "http://"+up.ln.Addr().String(), src, Options{UpstreamIdle: time.Minute})
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: pooled}, Timeout: 10 * time.Second}
			defer client.CloseIdleConnections()
			do := func(method string) int {
				var body io.Reader
				if method == "POST" {
					body = strings.NewReader("payload")
				}
				req, _ := http.NewRequest(method, base+"/x", body)
				resp, err := client.Do(req)
				if err != nil {
					t.Fatalf("%s: %v", method, err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode
			}
			var wg sync.WaitGroup
			for range pooled {
				wg.Go(func() {
					if s := do("GET"); s != 200 {
						t.Errorf("warm-up GET: %d", s)
					}
				})
			}
			wg.Wait()
			warm := up.accepted.Load()
			up.trap.Store(true)
			if s := do("GET"); s != 200 {
				t.Fatalf("a GET meeting %d pooled connections closing as it was written answered %d, want 200", warm, s)
			}
			if used := up.accepted.Load() - warm; used != 1 {
				t.Errorf("the GET opened %d new connections, want 1 (every pooled one tried first)", used)
			}
			if s := do("POST"); s != http.StatusBadGateway {
				t.Errorf("a POST meeting a close as it was written answered %d, want 502 (never sent twice)", s)
			}
			up.broken.Store(true)
			client.CloseIdleConnections()
			before := up.accepted.Load()
			if s := do("GET"); s != http.StatusBadGateway {
				t.Errorf("a GET to an upstream closing new connections unanswered answered %d, want 502", s)
			}
			if n := up.accepted.Load() - before; n != 1 {
				t.Errorf("a GET to a failing upstream opened %d connections, want 1: a new connection's failure is not retried", n)
			}
		})
	}
}
