package gateway

import (
	"bufio"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/internal/testkit/nginxtest"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/server"
	"github.com/sluice-rl/sluice/store/memory"
)

// nginxRules trust nginx on loopback; one rule counts per client address on
// /ip/, one per user on POST /otp.
const nginxRules = `
trustedProxies: [127.0.0.1/32]
rules:
  - {id: per-ip, match: {path: "/ip/*"}, key: [ip], rate: 3, per: 1h}
  - {id: otp, match: {method: POST, path: /otp}, key: [user], rate: 1, per: 1h}
`

// startNginx runs nginx with the shipped snippet in front of sluiceAddr and
// upstreamAddr and returns its base URL.
func startNginx(t *testing.T, sluiceAddr, upstreamAddr string) string {
	return nginxtest.Start(t, "../examples/proxies/nginx.conf", sluiceAddr, upstreamAddr)
}

// Behind the shipped nginx snippet, nothing a client writes in Forwarded,
// X-Forwarded-*, X-Original-* or X-Real-IP changes the address, method or
// path that sluice counts.
func TestShippedNginxSnippetIgnoresSpoofedHeaders(t *testing.T) {
	cfg, err := rules.Parse("nginx.yaml", []byte(nginxRules))
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(cfg, engine.Options{Store: memory.New()})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Options{Engine: e, Loopback: true, AuthProxy: server.AuthNginx})
	if err != nil {
		t.Fatal(err)
	}
	sl := httptest.NewServer(srv)
	defer sl.Close()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("upstream\n")) }))
	defer up.Close()
	base := startNginx(t, strings.TrimPrefix(sl.URL, "http://"), strings.TrimPrefix(up.URL, "http://"))

	spoofs := func(i int) map[string]string {
		return map[string]string{
			"Forwarded":          fmt.Sprintf("for=9.9.9.%d", i),
			"X-Forwarded-For":    fmt.Sprintf("9.9.8.%d", i),
			"X-Real-IP":          fmt.Sprintf("9.9.7.%d", i),
			"X-Forwarded-Uri":    "/elsewhere",
			"X-Forwarded-Method": "GET",
			"X-Original-URI":     "/elsewhere",
			"X-Original-Method":  "GET",
			"X-Original-URL":     "/elsewhere",
		}
	}
	send := func(method, path string, i int) int {
		req, _ := http.NewRequest(method, base+path, nil)
		for k, v := range spoofs(i) {
			req.Header.Set(k, v)
		}
		req.Header.Set("X-User-Id", "u1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// Per IP: three admitted whatever addresses the client claims, then 429.
	for i, want := range []int{200, 200, 200, 429, 429} {
		if got := send("GET", fmt.Sprintf("/ip/%d", i), i); got != want {
			t.Fatalf("per-ip request %d: %d, want %d", i+1, got, want)
		}
	}
	// Per path: POST /otp counts as /otp whatever URI or method the client
	// claims in headers.
	for i, want := range []int{200, 429, 429} {
		if got := send("POST", "/otp", i); got != want {
			t.Fatalf("otp request %d: %d, want %d", i+1, got, want)
		}
	}
	// Path tricks through nginx count as /otp too.
	for i, p := range []string{"//otp", "/./otp", "/%6Ftp", "/otp/"} {
		if got := send("POST", p, i); got != 429 {
			t.Fatalf("POST %s: %d, want 429", p, got)
		}
	}
}

// When sluice cannot be reached, nginx fails the request closed; the
// shipped snippet answers 503, not a 429 that would tell every client it
// spent a quota it never had. A 400 from sluice reaches the client as 400.
func TestShippedNginxSnippetTellsAnOutageFromALimit(t *testing.T) {
	up := newRecorder(t, nil)
	down := startNginx(t, closedAddr(t), strings.TrimPrefix(up.srv.URL, "http://"))
	resp, err := http.Get(down + "/anything")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("sluice unreachable: %d %s, want a 503 problem", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	base, _ := startAuthPlane(t, up.srv.URL, planeRules, Options{})
	c := dialPlane(t, base)
	fmt.Fprintf(c, "POST /%%2Fotp HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
	resp, err = http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("an encoded slash through nginx: %d, want sluice's 400", resp.StatusCode)
	}
	if n := up.count("/anything") + up.count("//otp"); n != 0 {
		t.Errorf("the upstream saw %d requests", n)
	}

	// The documented switch: failing open, sluice unreachable passes the
	// request on, and only then; a limit is still a 429 and nothing passes.
	open := nginxtest.Start(t, "../examples/proxies/nginx.conf", closedAddr(t), strings.TrimPrefix(up.srv.URL, "http://"),
		"set $sluice_fail_open 0;", "set $sluice_fail_open 1;")
	for _, method := range []string{"GET", "POST"} {
		req, _ := http.NewRequest(method, open+"/open", strings.NewReader("body"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s, sluice unreachable, failing open: %d, want the upstream's 200", method, resp.StatusCode)
		}
	}
	if n := up.count("/open"); n != 2 {
		t.Errorf("failing open, the upstream saw %d of 2 requests", n)
	}
	limitedBase := startAuthPlaneWith(t, up.srv.URL, "rules:\n  - {id: one, key: [ip], rate: 1, per: 1h}\n",
		"set $sluice_fail_open 0;", "set $sluice_fail_open 1;")
	codes := []int{}
	for range 2 {
		resp, err := http.Get(limitedBase + "/limited")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	if codes[0] != 200 || codes[1] != 429 || up.count("/limited") != 1 {
		t.Errorf("failing open with sluice up: %v and %d upstream requests, want 200 then 429, 1", codes, up.count("/limited"))
	}
}
