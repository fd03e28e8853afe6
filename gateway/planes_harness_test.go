package gateway

// The conformance suite's harness: the planes it runs on, the upstreams
// it puts behind them, and the requests it sends.

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/internal/testkit/nginxtest"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/server"
	"github.com/sluice-rl/sluice/store/memory"
)

// testPlane starts one plane in front of upstream with the rule file src and
// returns its base URL and engine. The engine's store runs on a clock that
// stands still, so that counts are exact and nothing refills mid-test.
type testPlane struct {
	name    string
	gateway bool // it forwards requests itself
	start   func(t *testing.T, upstream, src string, o Options) (string, *engine.Engine)
}

var testPlanes = []testPlane{
	{name: "fasthttp", gateway: true, start: startFastPlane},
	{name: "net-http", gateway: true, start: startNetHTTPPlane},
	{name: "forward-auth", start: startAuthPlane},
}

func planeEngine(t *testing.T, src string) *engine.Engine {
	t.Helper()
	cfg, err := rules.Parse("planes.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	clock := sluice.NewManualClock(time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC))
	e, err := engine.New(cfg, engine.Options{Store: memory.New(memory.WithClock(clock)), Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func loopbackListener(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func startFastPlane(t *testing.T, upstream, src string, o Options) (string, *engine.Engine) {
	return startGatewayPlane(t, "fasthttp", upstream, src, o)
}

func startNetHTTPPlane(t *testing.T, upstream, src string, o Options) (string, *engine.Engine) {
	return startGatewayPlane(t, "net/http", upstream, src, o)
}

func startGatewayPlane(t *testing.T, plane, upstream, src string, o Options) (string, *engine.Engine) {
	e := planeEngine(t, src)
	u, _ := url.Parse(upstream)
	o.Logger = quietLog
	p, err := New(plane, u, e, o)
	if err != nil {
		t.Fatal(err)
	}
	return serve(t, p), e
}

// serve serves p on a loopback listener until the test ends, and returns
// its base URL.
func serve(t *testing.T, p Plane) string {
	ln := loopbackListener(t)
	go p.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		p.Shutdown(ctx)
	})
	return "http://" + ln.Addr().String()
}

// startAuthPlane runs sluice's forward-auth endpoint behind real nginx with
// the shipped snippet (examples/proxies/nginx.conf), which must trust nginx.
func startAuthPlane(t *testing.T, upstream, src string, _ Options) (string, *engine.Engine) {
	return startAuthPlaneEdited(t, upstream, src)
}

// startAuthPlaneWith is startAuthPlane with edits to the snippet
// (nginxtest.Start).
func startAuthPlaneWith(t *testing.T, upstream, src string, edits ...string) string {
	base, _ := startAuthPlaneEdited(t, upstream, src, edits...)
	return base
}

func startAuthPlaneEdited(t *testing.T, upstream, src string, edits ...string) (string, *engine.Engine) {
	e := planeEngine(t, "trustedProxies: [127.0.0.1/32]\n"+src)
	srv, err := server.New(server.Options{Engine: e, Loopback: true, AuthProxy: server.AuthNginx, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	sl := httptest.NewServer(srv)
	t.Cleanup(sl.Close)
	return nginxtest.Start(t, "../examples/proxies/nginx.conf", strings.TrimPrefix(sl.URL, "http://"), strings.TrimPrefix(upstream, "http://"), edits...), e
}

// recorder is an upstream that counts what reaches it, by path.
type recorder struct {
	mu   sync.Mutex
	hits map[string]int
	last *http.Request
	srv  *httptest.Server
}

func newRecorder(t *testing.T, h func(w http.ResponseWriter, r *http.Request)) *recorder {
	rec := &recorder{hits: map[string]int{}}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.mu.Lock()
		rec.hits[r.URL.Path]++
		rec.last = r
		rec.mu.Unlock()
		if h != nil {
			h(w, r)
			return
		}
		io.Copy(io.Discard, r.Body)
		w.Write([]byte("upstream\n"))
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (r *recorder) count(path string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hits[path]
}

func (r *recorder) lastRequest() *http.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// send makes one request and returns its answer with the body read.
func send(t *testing.T, method, target string, header map[string]string, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, target, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// checkRefusal checks a refusal by the book: its status, Retry-After,
// RateLimit fields naming the rule, no caching, a problem body.
func checkRefusal(t *testing.T, resp *http.Response, status int, rule string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d", resp.StatusCode, status)
	}
	if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 {
		t.Errorf("Retry-After %q: want whole seconds >= 1", resp.Header.Get("Retry-After"))
	}
	if !strings.HasPrefix(resp.Header.Get("RateLimit-Policy"), `"`+rule+`";`) || !strings.HasPrefix(resp.Header.Get("RateLimit"), `"`+rule+`";r=0`) {
		t.Errorf("RateLimit fields %q / %q do not name %s", resp.Header.Get("RateLimit-Policy"), resp.Header.Get("RateLimit"), rule)
	}
	if resp.Header.Get("Cache-Control") != "no-store" || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("Cache-Control %q, Content-Type %q", resp.Header.Get("Cache-Control"), resp.Header.Get("Content-Type"))
	}
}

const planeRules = `
rules:
  - {id: otp, match: {method: POST, path: /otp}, key: [ip], rate: 3, per: 10m}
  - {id: per-user, match: {path: "/u/*"}, key: [header:X-User], rate: 2, per: 1h}
  - {id: export, match: {path: /export}, key: [ip], rate: 10, per: 1h, cost: 5}
  - {id: shadowed, match: {path: /shadow}, key: [ip], rate: 1, per: 1h, mode: shadow}
  - {id: logins, match: {path: /login}, key: [ip], rate: 2, per: 1h, countOn: {status: [401]}}
  - {id: queue, match: {path: /queue}, key: [ip], rate: 1, per: 5s, algorithm: leaky-queue, burst: 3}
  - {id: slowq, match: {path: /slowq}, key: [ip], rate: 1, per: 30s, algorithm: leaky-queue, burst: 3}
  - {id: ws, match: {path: /ws}, key: [ip], rate: 2, per: 1h}
  - {id: sms, match: {method: POST, path: /sms}, key: [phone], rate: 3, per: 10m}
  - {id: tenant, match: {path: /tenant}, key: [header:X-Tenant], rate: 5, per: 1h, onMissingKey: reject}
  - {id: as-nginx, match: {path: /as-nginx}, key: [ip], rate: 1, per: 1h, status: 503}
  - {id: ok-counted, match: {path: /ok-counted}, key: [ip], rate: 2, per: 1h, countOn: {status: [200]}}
keys:
  phone: {body: phone}
`

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func remaining(t *testing.T, e *engine.Engine, rule, key string) int64 {
	t.Helper()
	d, _, err := e.Inspect(context.Background(), rule, key)
	if err != nil {
		t.Fatal(err)
	}
	return d.Remaining
}

// waitFor polls cond for up to 20 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("waited 20 s for %s", what)
}

func dialPlane(t *testing.T, base string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// upgradeOn sends a WebSocket-style upgrade request on c.
func upgradeOn(t *testing.T, c net.Conn, path, proto string) *bufio.Reader {
	t.Helper()
	fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: %s\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", path, proto)
	return bufio.NewReader(c)
}

// echoes checks that the tunnel on c carries bytes both ways.
func echoes(t *testing.T, c net.Conn, br *bufio.Reader) {
	t.Helper()
	c.Write([]byte("ping"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("tunnel: %q %v", buf, err)
	}
}

// rawUpstream serves each connection with h.
func rawUpstream(t *testing.T, h func(c net.Conn, br *bufio.Reader)) string {
	t.Helper()
	ln := loopbackListener(t)
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				h(c, bufio.NewReader(c))
			}()
		}
	}()
	return ln.Addr().String()
}

// echoUpgradeUpstream switches to the protocol asked (or, with wrong, to
// another) and echoes what follows.
func echoUpgradeUpstream(t *testing.T, wrong bool) string {
	return rawUpstream(t, echoUpgrade(wrong))
}

func echoUpgrade(wrong bool) func(c net.Conn, br *bufio.Reader) {
	return func(c net.Conn, br *bufio.Reader) {
		req, err := http.ReadRequest(br)
		if err != nil || req.Header.Get("Upgrade") == "" || !strings.EqualFold(req.Header.Get("Connection"), "upgrade") {
			c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
			return
		}
		proto := req.Header.Get("Upgrade")
		if wrong {
			proto = "something-else"
		}
		fmt.Fprintf(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: %s\r\nConnection: Upgrade\r\n\r\n", proto)
		io.Copy(c, br)
	}
}

// tlsEchoUpgradeUpstream is echoUpgradeUpstream over TLS, with the roots
// that trust it.
func tlsEchoUpgradeUpstream(t *testing.T) (string, *x509.CertPool) {
	t.Helper()
	srv := httptest.NewUnstartedServer(nil)
	srv.StartTLS() // for its certificate
	cert := srv.TLS.Certificates[0]
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	srv.Close()
	ln := tls.NewListener(loopbackListener(t), &tls.Config{Certificates: []tls.Certificate{cert}})
	t.Cleanup(func() { ln.Close() })
	var served atomic.Int32
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			served.Add(1)
			go func() {
				defer c.Close()
				echoUpgrade(false)(c, bufio.NewReader(c))
			}()
		}
	}()
	return ln.Addr().String(), roots
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	ln := loopbackListener(t)
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
