package server

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
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

// startNginx runs nginx with the shipped snippet (examples/proxies/nginx.conf),
// its addresses pointed at sluice and an upstream on free loopback ports, and
// returns its base URL. Without nginx the test skips, loudly; in CI it fails.
func startNginx(t *testing.T, sluiceAddr, upstreamAddr string) string {
	t.Helper()
	bin, err := exec.LookPath("nginx")
	if err != nil {
		for _, p := range []string{"/usr/sbin/nginx", "/usr/local/sbin/nginx"} {
			if _, e := os.Stat(p); e == nil {
				bin, err = p, nil
			}
		}
	}
	if err != nil {
		if ci() {
			t.Fatal("nginx is not installed, and CI is set: CI must install it (apt-get install nginx)")
		}
		t.Skip("SKIPPING: nginx is not installed; install it (apt-get install nginx) to test the shipped snippet")
	}
	snippet, err := os.ReadFile("../examples/proxies/nginx.conf")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for attempt := 0; ; attempt++ {
		port := freePort(t)
		conf := strings.NewReplacer(
			"127.0.0.1:9000", upstreamAddr,
			"127.0.0.1:8080", sluiceAddr,
			"127.0.0.1:8088", fmt.Sprintf("127.0.0.1:%d", port),
		).Replace(string(snippet))
		full := fmt.Sprintf(`daemon off;
master_process off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log;
events {}
http {
    access_log off;
    client_body_temp_path %[1]s/body;
    proxy_temp_path %[1]s/proxy;
    fastcgi_temp_path %[1]s/fastcgi;
    uwsgi_temp_path %[1]s/uwsgi;
    scgi_temp_path %[1]s/scgi;
%[2]s
}
`, dir, conf)
		path := filepath.Join(dir, "nginx.conf")
		if err := os.WriteFile(path, []byte(full), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "-p", dir, "-c", path, "-e", filepath.Join(dir, "error.log"))
		setProcessGroup(cmd)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		t.Cleanup(func() { killGroup(cmd); <-done })
		base := fmt.Sprintf("http://127.0.0.1:%d", port)
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			select {
			case err := <-done:
				done <- err
				log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
				if attempt < 3 && strings.Contains(string(log), "Address already in use") {
					goto retry // the port was taken between pick and bind
				}
				t.Fatalf("nginx exited: %v\n%s", err, log)
			default:
			}
			if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
				c.Close()
				return base
			}
		}
		t.Fatal("nginx did not start listening within 10s")
	retry:
	}
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func ci() bool {
	switch strings.ToLower(os.Getenv("CI")) {
	case "1", "true", "yes":
		return true
	}
	return false
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
	srv, err := New(Options{Engine: e, Loopback: true, AuthProxy: AuthNginx})
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
