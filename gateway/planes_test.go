package gateway

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/concurrency"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/httplimit"
	"github.com/sluice-rl/sluice/rules"
)

// The plane conformance suite: every behaviour of a request's life, run on
// every HTTP plane sluice has. A plane is one way requests reach the
// pipeline (httplimit.Limiter.Serve): the two gateway data planes, and
// forward-auth behind the shipped nginx snippet (the proxy forwards; sluice
// decides). A case that is about forwarding (bodies, upgrades, hop-by-hop
// headers) runs on the gateways only; every case about limits runs on all
// three. A behaviour added to one plane and not the others fails here.

// planeCase is one behaviour of the suite.
type planeCase struct {
	name         string
	gatewaysOnly bool
	run          func(t *testing.T, p testPlane)
}

func TestPlaneConformance(t *testing.T) {
	for _, c := range planeCases {
		t.Run(c.name, func(t *testing.T) {
			for _, p := range testPlanes {
				if c.gatewaysOnly && !p.gateway {
					continue
				}
				t.Run(p.name, func(t *testing.T) { c.run(t, p) })
			}
		})
	}
}

var planeCases = []planeCase{
	{name: "a request that cannot be counted is a 400 with no quota's fields", run: func(t *testing.T, p testPlane) {
		up := newRecorder(t, nil)
		base, _ := p.start(t, up.srv.URL, planeRules, Options{})
		for _, path := range []string{"/tenant", "/%2Fotp"} { // no X-Tenant; an encoded slash
			resp, _ := send(t, "GET", base+path, nil, "")
			if resp.StatusCode != 400 {
				t.Fatalf("GET %s: %d, want 400", path, resp.StatusCode)
			}
			for _, f := range []string{"RateLimit", "RateLimit-Policy", "Retry-After", "X-RateLimit-Remaining"} {
				if v := resp.Header.Get(f); v != "" {
					t.Errorf("GET %s: a 400 with %s: %s (no quota answered it)", path, f, v)
				}
			}
		}
		if n := up.count("/tenant"); n != 0 {
			t.Fatalf("the upstream saw %d", n)
		}
	}},
	{name: "a limit admits exactly its rate, then refuses by the book", run: func(t *testing.T, p testPlane) {
		up := newRecorder(t, nil)
		base, _ := p.start(t, up.srv.URL, planeRules, Options{})
		for i := range 5 {
			resp, _ := send(t, "POST", base+"/otp", nil, "x")
			if i < 3 {
				if resp.StatusCode != 200 || resp.Header.Get("RateLimit") != fmt.Sprintf(`"otp";r=%d`, 2-i) {
					t.Fatalf("request %d: %d, RateLimit %q", i+1, resp.StatusCode, resp.Header.Get("RateLimit"))
				}
				continue
			}
			checkRefusal(t, resp, 429, "otp")
		}
		if n := up.count("/otp"); n != 3 {
			t.Fatalf("the upstream saw %d, want 3", n)
		}
	}},
	{name: "a rule that says status: 503 refuses with 503, by the book otherwise", run: func(t *testing.T, p testPlane) {
		up := newRecorder(t, nil)
		base, _ := p.start(t, up.srv.URL, planeRules, Options{})
		if resp, _ := send(t, "GET", base+"/as-nginx", nil, ""); resp.StatusCode != 200 {
			t.Fatalf("the first request: %d", resp.StatusCode)
		}
		resp, _ := send(t, "GET", base+"/as-nginx", nil, "")
		checkRefusal(t, resp, 503, "as-nginx")
		if n := up.count("/as-nginx"); n != 1 {
			t.Fatalf("the upstream saw %d, want 1", n)
		}
	}},
	{name: "keys: each header value counts alone, odd bytes and spoofed forwarding headers change nothing", run: func(t *testing.T, p testPlane) {
		up := newRecorder(t, nil)
		base, _ := p.start(t, up.srv.URL, planeRules, Options{})
		users := []string{"u1", "ü-ß", strings.Repeat("x", 2000), "a|b", "a", "A"}
		for _, u := range users {
			for i := range 4 {
				resp, _ := send(t, "GET", base+"/u/x", map[string]string{"X-User": u, "X-Forwarded-For": fmt.Sprintf("9.9.9.%d", i), "X-Real-IP": "9.9.9.9"}, "")
				want := 200
				if i >= 2 {
					want = 429
				}
				if resp.StatusCode != want {
					t.Fatalf("user %.20q request %d: %d, want %d", u, i+1, resp.StatusCode, want)
				}
			}
		}
		// Whatever address a client claims, the one peer counts once.
		for i := range 5 {
			resp, _ := send(t, "POST", base+"/otp", map[string]string{"X-Forwarded-For": fmt.Sprintf("10.0.0.%d", i), "Forwarded": fmt.Sprintf("for=10.1.0.%d", i)}, "")
			if want := map[bool]int{true: 200, false: 429}[i < 3]; resp.StatusCode != want {
				t.Fatalf("spoofed request %d: %d, want %d", i+1, resp.StatusCode, want)
			}
		}
		if n := up.count("/u/x"); n != 2*len(users) {
			t.Fatalf("the upstream saw %d, want %d", n, 2*len(users))
		}
	}},
	{name: "paths servers read in different ways are refused or counted as the strictest reading", run: func(t *testing.T, p testPlane) {
		up := newRecorder(t, nil)
		base, _ := p.start(t, up.srv.URL, planeRules, Options{})
		for range 3 {
			send(t, "POST", base+"/otp", nil, "")
		}
		// Encoded slashes and backslashes: nginx and WSGI servers decode
		// them, Go's and Node's do not. Refused, never forwarded.
		for _, path := range []string{"/%2Fotp", "/x/..%2Fotp", "/api%2Fotp", "/x/..%5Cotp", "/x/..%252Fotp", "/otp%2F", "/%7%30tp"} {
			c := dialPlane(t, base)
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", path)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			resp.Body.Close()
			if resp.StatusCode < 400 {
				t.Errorf("POST %s: %d, want it refused", path, resp.StatusCode)
			}
		}
		// Path parameters: a servlet container routes "/otp;a=b" and
		// "/x/..;/otp" to /otp; they are counted as /otp. So is "post
		// /otp": some servers read a method in any case.
		for _, line := range []string{"POST /otp;a=b", "POST /x/..;/otp", "POST /otp;/", "POST /;x/otp", "post /otp", "Post /otp"} {
			c := dialPlane(t, base)
			method, path, _ := strings.Cut(line, " ")
			fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", method, path)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			resp.Body.Close()
			if resp.StatusCode < 400 {
				t.Errorf("POST %s with /otp exhausted: %d, want it refused", path, resp.StatusCode)
			}
		}
		up.mu.Lock()
		defer up.mu.Unlock()
		seen := 0
		for path, n := range up.hits {
			seen += n
			if path != "/otp" {
				t.Errorf("the upstream saw %s", path)
			}
		}
		if seen != 3 {
			t.Errorf("the upstream saw %d requests, want the 3 admitted", seen)
		}
	}},
	{name: "a body key is read as upstreams read it, or the request is refused: never passed uncounted", run: func(t *testing.T, p testPlane) {
		// The upstream is told which phone each request is for however it
		// reads the body: case-insensitive JSON names (Go), the last of a
		// repeated form field (PHP, Django), JSON sent as text/plain.
		const victim = "8801799999999"
		up := newRecorder(t, nil)
		base, _ := p.start(t, up.srv.URL, planeRules, Options{})
		for i := range 3 {
			if resp, _ := send(t, "POST", base+"/sms", map[string]string{"Content-Type": "application/json"}, `{"phone":"`+victim+`"}`); resp.StatusCode != 200 {
				t.Fatalf("request %d for the victim: %d", i+1, resp.StatusCode)
			}
		}
		pad := strings.Repeat(" ", rules.MaxBodyBytes)
		tricks := []struct{ contentType, body string }{
			{"application/json", `{"phone":"` + victim + `"}`},
			{"text/plain", `{"phone":"` + victim + `"}`},
			{"", `{"phone":"` + victim + `"}`},
			{"application/json", `{"PHONE":"` + victim + `"}`},
			{"application/json", `{"Phone":"` + victim + `"}`},
			{"application/json", "\ufeff" + `{"phone":"` + victim + `"}`},
			{"application/json", `{"phone":"8801700000001","Phone":"` + victim + `"}`},
			{"application/json", `{"phone":"8801700000001","phone":"` + victim + `"}`},
			{"application/json", `{"pad":"` + pad + `","phone":"` + victim + `"}`},
			{"application/json", `{"phone":"` + victim + `"}` + pad},
			{"application/x-www-form-urlencoded", "phone=8801700000001&phone=" + victim},
			{"application/x-www-form-urlencoded", "phone=" + victim + "&pad=" + pad + "&phone=8801700000001"},
			{"application/x-www-form-urlencoded; charset=utf-8", "phone=" + victim},
		}
		for _, tr := range tricks {
			resp, _ := send(t, "POST", base+"/sms", map[string]string{"Content-Type": tr.contentType}, tr.body)
			if resp.StatusCode < 400 {
				t.Errorf("%s %.60q: %d, want it refused (the victim's 3 are spent)", tr.contentType, tr.body, resp.StatusCode)
			}
			if resp.StatusCode == 429 && !strings.Contains(resp.Header.Get("RateLimit"), `"sms"`) {
				t.Errorf("%.60q: refused by %q, not the sms rule", tr.body, resp.Header.Get("RateLimit"))
			}
		}
		if n := up.count("/sms"); n != 3 {
			t.Fatalf("the upstream saw /sms %d times, want the victim's 3", n)
		}
	}},
	{name: "paths are matched in any case, and forwarded in their own", run: func(t *testing.T, p testPlane) {
		up := newRecorder(t, nil)
		base, _ := p.start(t, up.srv.URL, planeRules, Options{})
		for i, path := range []string{"/Otp", "/OTP", "/otp/", "/oTp"} {
			resp, _ := send(t, "POST", base+path, nil, "")
			if want := map[bool]int{true: 200, false: 429}[i < 3]; resp.StatusCode != want {
				t.Fatalf("POST %s: %d, want %d (counted as /otp)", path, resp.StatusCode, want)
			}
		}
		// A gateway forwards /otp/ as it matched it, /otp; behind nginx
		// the proxy forwards what it was sent.
		if n := up.count("/Otp") + up.count("/OTP") + up.count("/otp") + up.count("/otp/"); n != 3 || up.count("/Otp") != 1 || up.count("/OTP") != 1 {
			t.Fatalf("the upstream saw %v, want /Otp, /OTP and /otp once each", up.hits)
		}
	}},
	{name: "with encodedSlashes: decode, separators are read as slashes, counted and forwarded so", gatewaysOnly: true, run: func(t *testing.T, p testPlane) {
		up := newRecorder(t, nil)
		base, _ := p.start(t, up.srv.URL, "paths: {encodedSlashes: decode}\n"+planeRules, Options{})
		for i, path := range []string{"/x/..%2Fotp", "/api/..%5Cotp", "/x\\..\\otp", "/%2Fotp"} {
			c := dialPlane(t, base)
			fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", path)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			resp.Body.Close()
			if want := map[bool]int{true: 200, false: 429}[i < 3]; resp.StatusCode != want {
				t.Fatalf("POST %s: %d, want %d (counted as /otp)", path, resp.StatusCode, want)
			}
		}
		if n := up.count("/otp"); n != 3 {
			t.Fatalf("the upstream saw /otp %d times, want 3: %v", n, up.hits)
		}
	}},
	{name: "a weighted request takes its cost", run: func(t *testing.T, p testPlane) {
		up := newRecorder(t, nil)
		base, _ := p.start(t, up.srv.URL, planeRules, Options{})
		for i, want := range []int{200, 200, 429} {
			if resp, _ := send(t, "GET", base+"/export", nil, ""); resp.StatusCode != want {
				t.Fatalf("request %d: %d, want %d", i+1, resp.StatusCode, want)
			}
		}
	}},
	{name: "a shadow rule refuses nobody", run: func(t *testing.T, p testPlane) {
		up := newRecorder(t, nil)
		base, e := p.start(t, up.srv.URL, planeRules, Options{})
		for range 4 {
			if resp, _ := send(t, "GET", base+"/shadow", nil, ""); resp.StatusCode != 200 {
				t.Fatalf("shadow rule refused: %d", resp.StatusCode)
			}
		}
		if n := up.count("/shadow"); n != 4 {
			t.Fatalf("the upstream saw %d of 4", n)
		}
		for _, st := range e.Stats() {
			if st.Rule == "shadowed" && st.ShadowLimited != 3 {
				t.Fatalf("the shadow rule would have refused %d, want 3", st.ShadowLimited)
			}
		}
	}},
	{name: "countOn charges only the statuses it lists", gatewaysOnly: true, run: func(t *testing.T, p testPlane) {
		up := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
			code, _ := strconv.Atoi(r.URL.Query().Get("status"))
			w.WriteHeader(code)
		})
		base, _ := p.start(t, up.srv.URL, planeRules, Options{})
		for range 5 {
			if resp, _ := send(t, "POST", base+"/login?status=200", nil, ""); resp.StatusCode != 200 {
				t.Fatalf("a successful login was charged: %d", resp.StatusCode)
			}
		}
		for i, want := range []int{401, 401, 429} {
			if resp, _ := send(t, "POST", base+"/login?status=401", nil, ""); resp.StatusCode != want {
				t.Fatalf("failed login %d: %d, want %d", i+1, resp.StatusCode, want)
			}
		}
	}},
	{name: "forward-auth checks countOn rules and leaves the charge to the application", run: func(t *testing.T, p testPlane) {
		if p.gateway {
			t.Skip("gateways see the answer: the case above")
		}
		up := newRecorder(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(401) })
		base, e := p.start(t, up.srv.URL, planeRules, Options{})
		for range 3 {
			if resp, _ := send(t, "POST", base+"/login", nil, ""); resp.StatusCode != 401 {
				t.Fatalf("status %d", resp.StatusCode)
			}
		}
		// POST /v1/charge is the application's call; here the engine's.
		for range 2 {
			var res engine.Result
			req := rules.Request{Method: "POST", Path: "/login", ClientIP: mustAddr("127.0.0.1")}
			e.ChargeStatus(context.Background(), &req, engine.CheckOptions{}, 401, &res)
		}
		if resp, _ := send(t, "POST", base+"/login", nil, ""); resp.StatusCode != 429 {
			t.Fatalf("after two charged failures: %d, want 429", resp.StatusCode)
		}
		// Nor does it charge what the application answers 200 to: only
		// the application's charge counts, and here there is none.
		ok := newRecorder(t, nil)
		base, _ = p.start(t, ok.srv.URL, planeRules, Options{})
		for i := range 4 {
			if resp, _ := send(t, "GET", base+"/ok-counted", nil, ""); resp.StatusCode != 200 {
				t.Fatalf("request %d to a countOn: [200] rule nobody charged: %d, want 200", i+1, resp.StatusCode)
			}
		}
	}},
	{name: "a queued request is held, and a client that leaves gets its units back", run: func(t *testing.T, p testPlane) {
		up := newRecorder(t, nil)
		base, e := p.start(t, up.srv.URL, planeRules, Options{})
		if resp, _ := send(t, "GET", base+"/queue", nil, ""); resp.StatusCode != 200 {
			t.Fatalf("first: %d", resp.StatusCode)
		}
		before := remaining(t, e, "queue", "127.0.0.1")
		// The second waits 5 s in the queue; its client leaves after 300 ms.
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"/queue", nil)
		if _, err := http.DefaultClient.Do(req); err == nil {
			t.Fatal("a request queued for 5 s was answered within 300 ms")
		}
		cancel()
		waitFor(t, "the units of the client that left to come back", func() bool { return remaining(t, e, "queue", "127.0.0.1") == before })
		time.Sleep(5500 * time.Millisecond) // past the hold: a request still held would now go on
		if n := up.count("/queue"); n != 1 {
			t.Fatalf("the upstream saw %d requests, want 1: a client that left was forwarded", n)
		}
	}},
	{name: "a client that half-closes is never told of a success that did not happen", run: func(t *testing.T, p testPlane) {
		up := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/slow" {
				time.Sleep(500 * time.Millisecond)
			}
			w.Write([]byte("upstream\n"))
		})
		base, _ := p.start(t, up.srv.URL, planeRules, Options{})
		send(t, "GET", base+"/queue", nil, "") // the queue's first, served at once
		for _, path := range []string{"/queue", "/slow"} {
			c := dialPlane(t, base)
			fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
			c.(*net.TCPConn).CloseWrite() // sent, and nothing more: but still reading
			c.SetReadDeadline(time.Now().Add(20 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				continue // closed without an answer: as a client that left
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && string(body) != "upstream\n" {
				t.Errorf("%s, half-closed: %d %q — a success the upstream never gave", path, resp.StatusCode, body)
			}
		}
	}},
	{name: "a delay beyond the longest hold is refused and gives its units back", run: func(t *testing.T, p testPlane) {
		up := newRecorder(t, nil)
		base, e := p.start(t, up.srv.URL, planeRules, Options{})
		send(t, "GET", base+"/slowq", nil, "")
		before := remaining(t, e, "slowq", "127.0.0.1")
		resp, _ := send(t, "GET", base+"/slowq", nil, "") // 30 s away, beyond the 10 s hold
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("%d, Retry-After %q: want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		if got := remaining(t, e, "slowq", "127.0.0.1"); got != before {
			t.Fatalf("%d left after the refusal, want %d: its units were kept", got, before)
		}
		if n := up.count("/slowq"); n != 1 {
			t.Fatalf("the upstream saw %d, want 1", n)
		}
	}},
	{name: "a full concurrency limit sheds with 503", gatewaysOnly: true, run: func(t *testing.T, p testPlane) {
		release := make(chan struct{})
		entered := make(chan struct{}, 1)
		up := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/hold" {
				entered <- struct{}{}
				<-release
			}
		})
		conc := concurrency.New(concurrency.Fixed{N: 1}, concurrency.Options{Min: 1, Max: 1})
		base, _ := p.start(t, up.srv.URL, planeRules, Options{HTTP: httplimit.Options{Concurrency: conc}})
		done := make(chan int)
		go func() {
			resp, _ := send(t, "GET", base+"/hold", nil, "")
			done <- resp.StatusCode
		}()
		<-entered
		resp, body := send(t, "GET", base+"/other", nil, "")
		close(release)
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" || !strings.Contains(body, "temporary-reduced-capacity") {
			t.Fatalf("%d %v %s: want 503 temporary-reduced-capacity, Retry-After 1", resp.StatusCode, resp.Header, body)
		}
		if code := <-done; code != 200 {
			t.Fatalf("the request holding the permit: %d", code)
		}
		if conc.InFlight() != 0 {
			t.Fatalf("%d permits still held", conc.InFlight())
		}
	}},
	{name: "an upgrade the upstream ignores is an ordinary answer, and what follows is limited", run: func(t *testing.T, p testPlane) {
		for _, proto := range []string{"websocket", "h2c"} {
			up := newRecorder(t, nil)
			base, _ := p.start(t, up.srv.URL, planeRules, Options{})
			for range 3 {
				send(t, "POST", base+"/otp", nil, "")
			}
			// One connection: the upgrade, then 20 requests pipelined
			// behind it, as an attacker would send them.
			c := dialPlane(t, base)
			var b strings.Builder
			fmt.Fprintf(&b, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: %s\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", proto)
			for range 20 {
				b.WriteString("POST /otp HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx")
			}
			c.Write([]byte(b.String()))
			br := bufio.NewReader(c)
			var codes []int
			for range 21 {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					break // nginx closes the connection after its first refusal
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				codes = append(codes, resp.StatusCode)
			}
			refused := 0
			for _, code := range codes[1:] {
				if code == 429 {
					refused++
				}
			}
			if len(codes) == 0 || codes[0] != 200 || refused != len(codes)-1 || refused == 0 || p.gateway && refused != 20 || up.count("/otp") != 3 {
				t.Fatalf("%s: answers %v, the upstream saw %d POST /otp: want 200, then only refusals (all 20 on a gateway), 3 seen", proto, codes, up.count("/otp"))
			}
			c.Close()
		}
	}},
	{name: "an accepted upgrade is tunnelled, and counted like a request", gatewaysOnly: true, run: func(t *testing.T, p testPlane) {
		addr := echoUpgradeUpstream(t, false)
		base, _ := p.start(t, "http://"+addr, planeRules, Options{})
		for i := range 3 {
			c := dialPlane(t, base)
			br := upgradeOn(t, c, "/ws", "websocket")
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if i == 2 {
				checkRefusal(t, resp, 429, "ws")
				c.Close()
				continue
			}
			if resp.StatusCode != 101 || !strings.EqualFold(resp.Header.Get("Upgrade"), "websocket") || resp.Header.Get("RateLimit") == "" {
				t.Fatalf("upgrade %d: %d %v", i+1, resp.StatusCode, resp.Header)
			}
			echoes(t, c, br)
			c.Close()
		}
	}},
	{name: "a 2xx that names an upgrade is an ordinary answer, never a tunnel", gatewaysOnly: true, run: func(t *testing.T, p testPlane) {
		// The upstream answers 200 with Connection: Upgrade and Upgrade,
		// then echoes whatever follows: had the gateway tunnelled, the
		// client's next request would come back to it as its answer.
		up := rawUpstream(t, func(c net.Conn, br *bufio.Reader) {
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			c.Write([]byte("HTTP/1.1 200 OK\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nContent-Length: 3\r\n\r\nok\n"))
			io.Copy(c, br)
		})
		base, _ := p.start(t, "http://"+up, planeRules, Options{})
		c := dialPlane(t, base)
		defer c.Close()
		br := bufio.NewReader(c)
		fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
		for i := range 2 {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("answer %d: %v (a tunnel would echo the request back)", i+1, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(body) != "ok\n" {
				t.Fatalf("answer %d: %d %q, want the upstream's 200", i+1, resp.StatusCode, body)
			}
			fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: x\r\n\r\n") // an ordinary request on the same connection
		}
	}},
	{name: "an upgrade to another protocol than asked is refused", gatewaysOnly: true, run: func(t *testing.T, p testPlane) {
		addr := echoUpgradeUpstream(t, true)
		base, _ := p.start(t, "http://"+addr, planeRules, Options{})
		c := dialPlane(t, base)
		resp, err := http.ReadResponse(upgradeOn(t, c, "/ws", "websocket"), nil)
		if err != nil || resp.StatusCode != 502 {
			t.Fatalf("%v %v: want 502", resp, err)
		}
	}},
	{name: "upgrades can be refused outright", gatewaysOnly: true, run: func(t *testing.T, p testPlane) {
		addr := echoUpgradeUpstream(t, false)
		base, e := p.start(t, "http://"+addr, planeRules, Options{Upgrades: Upgrades{Refuse: true}})
		c := dialPlane(t, base)
		resp, err := http.ReadResponse(upgradeOn(t, c, "/ws", "websocket"), nil)
		if err != nil || resp.StatusCode != 501 {
			t.Fatalf("%v %v: want 501", resp, err)
		}
		if got := remaining(t, e, "ws", "127.0.0.1"); got != 1 {
			t.Fatalf("a refused upgrade was not counted: %d left, want 1", got)
		}
	}},
	{name: "a tunnel ends when idle, when too old, and tunnels are bounded", gatewaysOnly: true, run: func(t *testing.T, p testPlane) {
		addr := echoUpgradeUpstream(t, false)
		base, _ := p.start(t, "http://"+addr, "rules:\n  - {id: any, key: [ip], rate: 1000, per: 1h}\n",
			Options{Upgrades: Upgrades{IdleTimeout: 300 * time.Millisecond, MaxDuration: 3 * time.Second, MaxTunnels: 1}})
		// Idle: nothing crosses, the tunnel closes.
		c := dialPlane(t, base)
		br := upgradeOn(t, c, "/ws", "websocket")
		if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 101 {
			t.Fatalf("%v %v", resp, err)
		}
		// Bounded: a second tunnel while the first is open gets 503.
		c2 := dialPlane(t, base)
		if resp, err := http.ReadResponse(upgradeOn(t, c2, "/ws", "websocket"), nil); err != nil || resp.StatusCode != 503 {
			t.Fatalf("a second tunnel beyond MaxTunnels 1: %v %v, want 503", resp, err)
		}
		c2.Close()
		c.SetReadDeadline(time.Now().Add(20 * time.Second))
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("an idle tunnel: %v, want it closed", err)
		}
		c.Close()
		// Busy, but too old: bytes every 50 ms keep it from idling; its
		// total duration still ends it.
		waitFor(t, "the first tunnel to be released", func() bool {
			c = dialPlane(t, base)
			br = upgradeOn(t, c, "/ws", "websocket")
			resp, err := http.ReadResponse(br, nil)
			if err == nil && resp.StatusCode == 101 {
				return true
			}
			c.Close()
			return false
		})
		stop := time.Now().Add(30 * time.Second)
		for time.Now().Before(stop) {
			c.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Write([]byte("x")); err != nil {
				return // closed
			}
			if _, err := br.ReadByte(); err != nil {
				return // closed
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatal("a busy tunnel outlived MaxDuration by 27 s")
	}},
	{name: "upgrades reach an https upstream", gatewaysOnly: true, run: func(t *testing.T, p testPlane) {
		addr, roots := tlsEchoUpgradeUpstream(t)
		base, _ := p.start(t, "https://"+addr, planeRules, Options{UpstreamTLS: &tls.Config{RootCAs: roots}})
		c := dialPlane(t, base)
		br := upgradeOn(t, c, "/ws", "websocket")
		if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 101 {
			t.Fatalf("%v %v", resp, err)
		}
		echoes(t, c, br)
	}},
	{name: "requests and answers reach an https upstream", gatewaysOnly: true, run: func(t *testing.T, p testPlane) {
		up := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("tls " + r.URL.Path)) }))
		defer up.Close()
		roots := x509.NewCertPool()
		roots.AddCert(up.Certificate())
		base, _ := p.start(t, up.URL, planeRules, Options{UpstreamTLS: &tls.Config{RootCAs: roots}})
		if resp, body := send(t, "GET", base+"/a", nil, ""); resp.StatusCode != 200 || body != "tls /a" {
			t.Fatalf("%d %q", resp.StatusCode, body)
		}
	}},
	{name: "hop-by-hop headers stay, forwarding headers are rebuilt, the path is the one limited", gatewaysOnly: true, run: func(t *testing.T, p testPlane) {
		up := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Keep-Alive", "timeout=5")
			w.Header().Set("X-Hop", "secret")
			w.Header().Set("Connection", "X-Hop")
			w.Write([]byte("ok"))
		})
		base, _ := p.start(t, up.srv.URL, planeRules, Options{})
		req, _ := http.NewRequest("GET", base+"//a/./b/../items?x=1", nil)
		req.Host = "shop.example"
		req.Header.Set("X-Forwarded-For", "9.9.9.9")
		req.Header.Set("Forwarded", "for=9.9.9.9")
		req.Header.Set("Proxy-Authorization", "Basic secret")
		req.Header.Set("Te", "deflate")
		req.Header.Set("X-Drop", "1")
		req.Header.Set("Connection", "X-Drop")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		r := up.lastRequest()
		if r.URL.Path != "/a/items" || r.URL.RawQuery != "x=1" {
			t.Errorf("upstream saw %q ? %q, want the normalised /a/items ? x=1", r.URL.Path, r.URL.RawQuery)
		}
		if r.Host != "shop.example" || r.Header.Get("X-Forwarded-Host") != "shop.example" || r.Header.Get("X-Forwarded-Proto") != "http" {
			t.Errorf("Host %q, X-Forwarded-Host %q, -Proto %q", r.Host, r.Header.Get("X-Forwarded-Host"), r.Header.Get("X-Forwarded-Proto"))
		}
		if got := r.Header.Get("X-Forwarded-For"); got != "127.0.0.1" || r.Header.Get("Forwarded") != "" {
			t.Errorf("X-Forwarded-For %q, Forwarded %q: an untrusted peer's chain must be dropped, the peer appended", got, r.Header.Get("Forwarded"))
		}
		if r.Header.Get("Proxy-Authorization") != "" || r.Header.Get("Te") != "" || r.Header.Get("X-Drop") != "" {
			t.Errorf("hop-by-hop request headers crossed: %v", r.Header)
		}
		if resp.Header.Get("X-Hop") != "" || resp.Header.Get("Keep-Alive") != "" {
			t.Errorf("hop-by-hop response headers crossed: %v", resp.Header)
		}
		// TE: trailers is the one value that crosses (a gRPC upstream
		// needs it), as httputil.ReverseProxy passes it.
		send(t, "GET", base+"/te", map[string]string{"Te": "trailers, deflate"}, "")
		if te := up.lastRequest().Header["Te"]; len(te) != 1 || te[0] != "trailers" {
			t.Errorf("TE: trailers, deflate reached the upstream as %q, want trailers", te)
		}
	}},
	{name: "hop-by-hop and forwarding fields are recognised in any case and any number", gatewaysOnly: true, run: func(t *testing.T, p testPlane) {
		up := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Connection", "x-hop")
			w.Header().Set("X-Hop", "secret")
			w.Write([]byte("ok"))
		})
		base, _ := p.start(t, up.srv.URL, planeRules, Options{})
		c := dialPlane(t, base)
		c.Write([]byte("GET /a HTTP/1.1\r\nhost: x\r\nconnection: x-drop\r\nx-drop: 1\r\nproxy-authorization: secret\r\nte: gzip\r\n" +
			"x-forwarded-for: 6.6.6.6\r\nX-Forwarded-For: 7.7.7.7\r\nforwarded: for=8.8.8.8\r\nx-forwarded-host: evil\r\n" +
			"x-real-ip: 6.6.6.6\r\nTrue-Client-IP: 6.6.6.7\r\nX-Original-URL: /admin\r\nX-Forwarded-Port: 1\r\n\r\n"))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		r := up.lastRequest()
		if xri := r.Header["X-Real-Ip"]; len(xri) != 1 || xri[0] != "127.0.0.1" {
			t.Errorf("X-Real-IP reached the upstream as %q, want the address counted", xri)
		}
		for _, k := range []string{"X-Drop", "Proxy-Authorization", "Te", "Forwarded", "Connection", "True-Client-Ip", "X-Original-Url", "X-Forwarded-Port"} {
			if v, ok := r.Header[k]; ok {
				t.Errorf("the upstream got %s: %q", k, v)
			}
		}
		if xff := r.Header["X-Forwarded-For"]; len(xff) != 1 || xff[0] != "127.0.0.1" {
			t.Errorf("X-Forwarded-For reached the upstream as %q, want only the peer", xff)
		}
		if xfh := r.Header["X-Forwarded-Host"]; len(xfh) != 1 || xfh[0] != "x" {
			t.Errorf("X-Forwarded-Host reached the upstream as %q", xfh)
		}
		if v := resp.Header.Get("X-Hop"); v != "" {
			t.Errorf("a field the upstream's Connection named reached the client: %q", v)
		}
		// A Connection field naming the request's own framing does not
		// unframe it: the body still reaches the upstream whole.
		c2 := dialPlane(t, base)
		c2.Write([]byte("POST /framed HTTP/1.1\r\nHost: x\r\nConnection: Content-Length, Host\r\nContent-Length: 4\r\n\r\nbody"))
		resp2, err := http.ReadResponse(bufio.NewReader(c2), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp2.Body.Close()
		if resp2.StatusCode != 200 || up.count("/framed") != 1 {
			t.Errorf("Connection: Content-Length: %d, the upstream saw it %d times", resp2.StatusCode, up.count("/framed"))
		}
	}},
	{name: "a trusted proxy's forwarding fields count in any case and over several lines", gatewaysOnly: true, run: func(t *testing.T, p testPlane) {
		up := newRecorder(t, nil)
		base, _ := p.start(t, up.srv.URL, "trustedProxies: [127.0.0.1/32]\n"+planeRules, Options{})
		for i := range 4 {
			c := dialPlane(t, base)
			fmt.Fprintf(c, "POST /otp HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nx-forwarded-for: 203.0.113.%d\r\nx-forwarded-for: 198.51.100.7\r\n\r\n", i)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatal(err)
			}
			// Counted per client behind the proxy: the nearest untrusted hop,
			// the last line's 198.51.100.7, each time.
			if want := map[bool]int{true: 200, false: 429}[i < 3]; resp.StatusCode != want {
				t.Fatalf("request %d: %d, want %d", i+1, resp.StatusCode, want)
			}
			r := up.lastRequest()
			if i < 3 && r.Header.Get("X-Forwarded-For") != fmt.Sprintf("203.0.113.%d, 198.51.100.7, 127.0.0.1", i) {
				t.Fatalf("a trusted proxy's chain reached the upstream as %q", r.Header["X-Forwarded-For"])
			}
		}
	}},
	{name: "the status line is the gateway's: HTTP/1.1 to HTTP/1.1 clients, whatever the upstream speaks", gatewaysOnly: true, run: func(t *testing.T, p testPlane) {
		addr := rawUpstream(t, func(c net.Conn, br *bufio.Reader) {
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			c.Write([]byte("HTTP/1.0 200 Fine By Me\r\nContent-Length: 2\r\n\r\nok"))
		})
		base, _ := p.start(t, "http://"+addr, planeRules, Options{})
		c := dialPlane(t, base)
		c.Write([]byte("GET /a HTTP/1.1\r\nHost: x\r\n\r\n"))
		line, _ := bufio.NewReader(c).ReadString('\n')
		if line != "HTTP/1.1 200 OK\r\n" {
			t.Fatalf("status line %q, want HTTP/1.1 200 OK", line)
		}
		// An HTTP/1.0 client gets its answer, then the connection closes.
		c10 := dialPlane(t, base)
		c10.Write([]byte("GET /b HTTP/1.0\r\nHost: x\r\n\r\n"))
		c10.SetReadDeadline(time.Now().Add(10 * time.Second))
		all, err := io.ReadAll(c10)
		if err != nil || !strings.HasSuffix(string(all), "\r\n\r\nok") || !strings.Contains(string(all), " 200 OK\r\n") {
			t.Fatalf("HTTP/1.0 client: %q %v", all, err)
		}
	}},
	{name: "bodies of any size are streamed both ways, unchanged", gatewaysOnly: true, run: func(t *testing.T, p testPlane) {
		const size = 10 << 20 // past fasthttp's 4 MiB request default and the 8 MiB kept for settling
		payload := make([]byte, size)
		rand.Read(payload)
		sum := sha256.Sum256(payload)
		up := newRecorder(t, func(w http.ResponseWriter, r *http.Request) {
			if r.Method == "POST" {
				h := sha256.New()
				if n, _ := io.Copy(h, r.Body); n != size || string(h.Sum(nil)) != string(sum[:]) {
					http.Error(w, "body changed on the way", 400)
				}
				// The rules read bodies (sms): a body read to find a key
				// keeps its declared length, for upstreams that refuse
				// chunked requests.
				if r.ContentLength != size || len(r.TransferEncoding) > 0 {
					http.Error(w, fmt.Sprintf("Content-Length %d, Transfer-Encoding %v", r.ContentLength, r.TransferEncoding), 400)
				}
				return
			}
			w.Write(payload)
		})
		base, _ := p.start(t, up.srv.URL, planeRules, Options{})
		if resp, body := send(t, "POST", base+"/upload", nil, string(payload)); resp.StatusCode != 200 {
			t.Fatalf("upload: %d %s", resp.StatusCode, body)
		}
		resp, body := send(t, "GET", base+"/download", nil, "")
		if got := sha256.Sum256([]byte(body)); resp.StatusCode != 200 || got != sum {
			t.Fatalf("download: %d, %d bytes, changed on the way", resp.StatusCode, len(body))
		}
	}},
	{name: "a slow upstream gives 504, an unreachable one 502", gatewaysOnly: true, run: func(t *testing.T, p testPlane) {
		release := make(chan struct{})
		up := newRecorder(t, func(w http.ResponseWriter, r *http.Request) { <-release })
		defer close(release)
		base, _ := p.start(t, up.srv.URL, planeRules, Options{Timeout: 200 * time.Millisecond})
		if resp, body := send(t, "GET", base+"/slow", nil, ""); resp.StatusCode != 504 || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("slow upstream: %d %s, want a 504 problem", resp.StatusCode, body)
		}
		dead, _ := p.start(t, "http://"+closedAddr(t), planeRules, Options{Timeout: time.Second})
		if resp, body := send(t, "GET", dead+"/x", nil, ""); resp.StatusCode != 502 || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("dead upstream: %d %s, want a 502 problem", resp.StatusCode, body)
		}
	}},
	{name: "an https upstream that never answers the handshake gives 504 within the timeout", gatewaysOnly: true, run: func(t *testing.T, p testPlane) {
		silent := rawUpstream(t, func(_ net.Conn, br *bufio.Reader) { io.Copy(io.Discard, br) }) // takes the ClientHello, says nothing
		base, _ := p.start(t, "https://"+silent, planeRules, Options{Timeout: 300 * time.Millisecond, UpstreamTLS: &tls.Config{InsecureSkipVerify: true}})
		// The client waits far longer than the gateway's timeout, and the
		// fasthttp plane's TLS handshake had no bound at all without one.
		cl := &http.Client{Timeout: 20 * time.Second}
		resp, err := cl.Get(base + "/x")
		if err != nil {
			t.Fatalf("the gateway did not answer: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 504 || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("silent TLS upstream: %d %s, want a 504 problem", resp.StatusCode, body)
		}
	}},
}
