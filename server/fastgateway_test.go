package server

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"github.com/sluice-rl/sluice/httplimit"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

func startFast(t *testing.T, upstream string, src string, o FastOptions) string {
	t.Helper()
	cfg, err := rules.Parse("g.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(cfg, engine.Options{Store: memory.New(), Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(upstream)
	o.Logger = quietLog
	g := NewFastGateway(u, e, o)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	t.Cleanup(func() { g.Shutdown() })
	return "http://" + ln.Addr().String()
}

const fastRules = "trustedProxies: [127.0.0.2/32]\nrules:\n  - {id: otp, match: {path: /otp}, key: [ip], rate: 2, per: 1h}\n  - {id: all, key: [ip], rate: 1000000, per: 1s}\n"

// Hop-by-hop headers never cross the proxy; X-Forwarded-For from an
// untrusted peer is dropped and the peer appended; the upstream sees the
// normalised path it was limited on.
func TestFastGatewayIsAnHTTPProxy(t *testing.T) {
	var seen atomic.Pointer[http.Request]
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r)
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("X-Hop", "secret")
		w.Header().Set("Connection", "X-Hop")
		w.Write([]byte("ok"))
	}))
	defer up.Close()
	base := startFast(t, up.URL, fastRules, FastOptions{})
	req, _ := http.NewRequest("GET", base+"//a/./b/../items?x=1", nil)
	req.Header.Set("X-Forwarded-For", "9.9.9.9")
	req.Header.Set("Proxy-Authorization", "Basic secret")
	req.Header.Set("Te", "trailers")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	r := seen.Load()
	if r == nil {
		t.Fatal("the upstream saw nothing")
	}
	if r.URL.Path != "/a/items" || r.URL.RawQuery != "x=1" {
		t.Errorf("upstream saw %q ? %q, want the normalised /a/items ? x=1", r.URL.Path, r.URL.RawQuery)
	}
	if got := r.Header.Get("X-Forwarded-For"); got != "127.0.0.1" {
		t.Errorf("X-Forwarded-For %q: an untrusted peer's chain must be dropped, the peer appended", got)
	}
	if r.Header.Get("Proxy-Authorization") != "" || r.Header.Get("Te") != "" {
		t.Errorf("hop-by-hop request headers crossed: %v", r.Header)
	}
	if r.Header.Get("X-Forwarded-Proto") != "http" || r.Header.Get("X-Forwarded-Host") == "" {
		t.Errorf("X-Forwarded-Proto/Host missing: %v", r.Header)
	}
	if resp.Header.Get("X-Hop") != "" || resp.Header.Get("Keep-Alive") != "" {
		t.Errorf("hop-by-hop response headers crossed: %v", resp.Header)
	}
	if resp.Header.Get("Ratelimit") == "" {
		t.Error("no RateLimit field on an allowed response")
	}
}

// Over the limit, the client gets the 429 problem and the upstream never
// sees the request.
func TestFastGatewayRejectsWithoutTheUpstream(t *testing.T) {
	var calls atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { calls.Add(1) }))
	defer up.Close()
	base := startFast(t, up.URL, fastRules, FastOptions{})
	var codes []int
	for _, p := range []string{"/otp", "/otp", "/otp", "//otp/", "/%6Ftp"} {
		resp, err := http.Post(base+p, "text/plain", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		codes = append(codes, resp.StatusCode)
		if resp.StatusCode == 429 && (resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "quota-exceeded") ||
			resp.Header.Get("Content-Type") != "application/problem+json") {
			t.Fatalf("429 without its fields: %v %s", resp.Header, body)
		}
	}
	if calls.Load() != 2 || codes[2] != 429 || codes[3] != 429 || codes[4] != 429 {
		t.Fatalf("codes %v, upstream calls %d: want 2 through, the rest 429", codes, calls.Load())
	}
}

// Refusals of different rules, one after another on one connection (so
// through the same worker state, which keeps its last refusal to write it
// again), each name their own rule: a kept refusal is never another's.
func TestFastGatewayRefusalsNameTheirOwnRule(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	base := startFast(t, up.URL, "rules:\n  - {id: a, match: {path: /a}, key: [ip], rate: 1, per: 1h}\n  - {id: b, match: {path: /b}, key: [ip], rate: 2, per: 1m}\n", FastOptions{})
	want := map[string]string{"/a": `"a";q=1;w=3600`, "/b": `"b";q=2;w=60`}
	for i, p := range []string{"/a", "/b", "/b", "/a", "/a", "/b", "/a", "/b", "/b", "/a"} {
		resp, err := http.Get(base + p)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if i < 3 { // the first of /a, the first two of /b pass
			continue
		}
		if resp.StatusCode != 429 || resp.Header.Get("RateLimit-Policy") != want[p] ||
			!strings.Contains(string(body), `"violated-policies":["`+p[1:]+`"]`) {
			t.Fatalf("request %d to %s: %d %v %s", i, p, resp.StatusCode, resp.Header, body)
		}
	}
}

// Bodies of any size are streamed both ways, unchanged.
func TestFastGatewayStreamsLargeBodies(t *testing.T) {
	const size = 24 << 20
	payload := make([]byte, size)
	rand.Read(payload)
	sum := sha256.Sum256(payload)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == "POST" {
			h := sha256.New()
			n, _ := io.Copy(h, r.Body)
			if n != size || string(h.Sum(nil)) != string(sum[:]) {
				http.Error(w, "body changed on the way", 400)
				return
			}
			return
		}
		w.Write(payload)
	}))
	defer up.Close()
	base := startFast(t, up.URL, fastRules, FastOptions{})
	resp, err := http.Post(base+"/upload", "application/octet-stream", strings.NewReader(string(payload)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("upload: %d", resp.StatusCode)
	}
	resp, err = http.Get(base + "/download")
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, _ := io.Copy(h, resp.Body)
	resp.Body.Close()
	if n != size || string(h.Sum(nil)) != string(sum[:]) {
		t.Fatalf("download: %d bytes, changed on the way", n)
	}
}

// An Upgrade (WebSocket) is tunnelled to the upstream after the limit check.
func TestFastGatewayTunnelsUpgrades(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil || req.Header.Get("Upgrade") != "websocket" {
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
			return
		}
		c.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"))
		io.Copy(c, br) // echo
	}()
	base := startFast(t, "http://"+ln.Addr().String(), fastRules, FastOptions{})
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	c.Write([]byte("GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	c.Write([]byte("ping"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("tunnel: %q %v", buf, err)
	}
}

// A slow upstream gives 504 after the timeout; an unreachable one 502.
func TestFastGatewayTimesOutAndReportsDeadUpstreams(t *testing.T) {
	release := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer up.Close()
	defer close(release)
	base := startFast(t, up.URL, fastRules, FastOptions{Timeout: 200 * time.Millisecond})
	resp, err := http.Get(base + "/slow")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 504 {
		t.Fatalf("slow upstream: %d, want 504", resp.StatusCode)
	}
	dead := startFast(t, "http://127.0.0.1:1", fastRules, FastOptions{Timeout: time.Second})
	resp, err = http.Get(dead + "/x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 502 {
		t.Fatalf("dead upstream: %d, want 502", resp.StatusCode)
	}
}

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// The 429 body is written by hand on the fast path: it must be the JSON
// encoding/json writes.
func TestAppendProblemIsJSON(t *testing.T) {
	p := &httplimit.Problem{Type: "https://x/#q", Title: "Quota \"Exceeded\"", Status: 429,
		Detail: "a\\b\n\tc é <&> \u2028\x01", ViolatedPolicies: []string{"a", "b"}}
	want, _ := json.Marshal(p)
	if got := appendProblem(nil, p); string(got) != string(want)+"\n" {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
}

// appendJSONString writes any valid UTF-8 string as encoding/json does:
// escaped runs and the plain runs copied between them.
func FuzzAppendJSONStringIsJSON(f *testing.F) {
	for _, s := range []string{"", "plain", "\"", "a\\", "<x>&", "\u2028\u2029", "é\u2027\u202a", "\x00\x1f\x7f", "ends in \n", "\u2028"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return // rule names and details are valid UTF-8; encoding/json would replace the rest
		}
		want, _ := json.Marshal(s)
		if got := appendJSONString(nil, s); string(got) != string(want) {
			t.Fatalf("appendJSONString(%q) = %s, want %s", s, got, want)
		}
	})
}
