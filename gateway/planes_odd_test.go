package gateway

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/httplimit"
)

// seen is what the upstream received of a request.
type seen struct {
	line    string // method, request target
	headers string // the fields that differ between HTTP stacks
}

// oddRequests are requests a client may send that HTTP stacks read in
// different ways: each is sent raw to every gateway plane.
var oddRequests = []struct {
	name, raw string
	status    int    // what both planes answer (0: not pinned)
	line      string // what the upstream is sent, if pinned
	headers   string
}{
	{name: "fragment", raw: "GET /otp#frag HTTP/1.1\r\nHost: x\r\n\r\n", status: 400},
	{name: "fragment after a query", raw: "GET /otp?a=1#frag HTTP/1.1\r\nHost: x\r\n\r\n", status: 400},
	{name: "raw UTF-8 path", raw: "GET /caf\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n", status: 200, line: "GET /caf%C3%A9"},
	{name: "raw invalid UTF-8 path", raw: "GET /caf\xe9 HTTP/1.1\r\nHost: x\r\n\r\n", status: 200, line: "GET /caf%E9"},
	{name: "tab in path", raw: "GET /a\tb HTTP/1.1\r\nHost: x\r\n\r\n", status: 400},
	{name: "unknown transfer coding", raw: "POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", status: 501},
	{name: "gzip transfer coding", raw: "POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", status: 501},
	{name: "chunked twice", raw: "POST /up HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", status: 501},
	{name: "body without a type", raw: "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", status: 200,
		headers: `Accept-Encoding="" Content-Type="" Transfer-Encoding=[] Content-Length=3`},
	{name: "no Accept-Encoding", raw: "GET /plain HTTP/1.1\r\nHost: x\r\n\r\n", status: 200,
		headers: `Accept-Encoding="" Content-Type="" Transfer-Encoding=[] Content-Length=0`},
	{name: "Accept-Encoding gzip", raw: "GET /plain HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n", status: 200,
		headers: `Accept-Encoding="gzip" Content-Type="" Transfer-Encoding=[] Content-Length=0`},
	{name: "percent-encoded slash", raw: "GET /a%2Fb HTTP/1.1\r\nHost: x\r\n\r\n", status: 400},
	{name: "dot segments", raw: "GET /a/../otp HTTP/1.1\r\nHost: x\r\n\r\n", status: 200, line: "GET /otp"},
	{name: "the limited path again", raw: "GET /otp HTTP/1.1\r\nHost: x\r\n\r\n", status: 429},
	{name: "absolute form", raw: "GET http://x/otp HTTP/1.1\r\nHost: x\r\n\r\n", status: 429},
	{name: "asterisk", raw: "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n"},
	{name: "lower-case method", raw: "get /plain HTTP/1.1\r\nHost: x\r\n\r\n", status: 200, line: "get /plain"},
	{name: "HTTP/1.0 without Host", raw: "GET /plain HTTP/1.0\r\n\r\n", status: 200, line: "GET /plain"},
	{name: "two Content-Lengths", raw: "POST /up HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", status: 400},
}

// sendRaw writes raw to addr and returns the answer's status (0: none).
func sendRaw(t *testing.T, addr, raw string) int {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte(raw)); err != nil {
		return 0
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Requests that HTTP stacks read in different ways are counted, answered
// and forwarded alike by both gateway planes, and as pinned here: a
// fragment is refused (a client never sends one), bytes outside ASCII are
// forwarded escaped, an unknown transfer coding is 501, the upstream gets
// the Accept-Encoding and Content-Type the client sent and nothing more.
// A count is shared across the list (the rule admits /otp once).
func TestPlanesReadOddRequestsAlike(t *testing.T) {
	var mu sync.Mutex
	var last seen
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		last = seen{line: r.Method + " " + r.RequestURI,
			headers: fmt.Sprintf("Accept-Encoding=%q Content-Type=%q Transfer-Encoding=%q Content-Length=%d", r.Header.Get("Accept-Encoding"), r.Header.Get("Content-Type"), r.TransferEncoding, r.ContentLength)}
		mu.Unlock()
	}))
	t.Cleanup(up.Close)
	const src = "rules:\n  - {id: otp, match: {path: /otp}, key: [ip], rate: 1, per: 1h}\n"
	type answer struct {
		status int
		seen   seen
	}
	got := map[string]map[string]answer{}
	for _, p := range testPlanes {
		if !p.gateway {
			continue
		}
		base, _ := p.start(t, up.URL, src, Options{})
		addr := strings.TrimPrefix(base, "http://")
		got[p.name] = map[string]answer{}
		for _, r := range oddRequests {
			mu.Lock()
			last = seen{}
			mu.Unlock()
			status := sendRaw(t, addr, r.raw)
			mu.Lock()
			got[p.name][r.name] = answer{status, last}
			mu.Unlock()
		}
	}
	for _, r := range oddRequests {
		a, b := got["fasthttp"][r.name], got["net-http"][r.name]
		switch {
		case a != b:
			t.Errorf("%s: the planes differ:\n  fasthttp: %d %+v\n  net/http: %d %+v", r.name, a.status, a.seen, b.status, b.seen)
		case r.status != 0 && a.status != r.status,
			r.line != "" && a.seen.line != r.line,
			r.headers != "" && a.seen.headers != r.headers:
			t.Errorf("%s: both planes answer %d and send %+v; want %d, %q, %q", r.name, a.status, a.seen, r.status, r.line, r.headers)
		}
	}
}

// The two gateways answer a refusal with the same bytes: the same status,
// fields and problem body.
func TestGatewaysRefuseAlike(t *testing.T) {
	up := newRecorder(t, nil)
	var answers []string
	for _, p := range testPlanes {
		if !p.gateway {
			continue
		}
		base, _ := p.start(t, up.srv.URL, planeRules, Options{HTTP: httplimit.Options{LegacyHeaders: true}})
		var resp *http.Response
		var body string
		for range 4 {
			resp, body = send(t, "POST", base+"/otp", nil, "")
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%d\n", resp.StatusCode)
		for _, k := range []string{"Retry-After", "Ratelimit-Policy", "Ratelimit", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Cache-Control", "Content-Type"} {
			fmt.Fprintf(&b, "%s: %q\n", k, resp.Header[k])
		}
		b.WriteString(body)
		answers = append(answers, b.String())
	}
	if answers[0] != answers[1] {
		t.Fatalf("the gateways refuse differently:\n%s\n---\n%s", answers[0], answers[1])
	}
}
