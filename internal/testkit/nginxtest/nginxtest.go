// Package nginxtest runs a real nginx with sluice's shipped forward-auth
// snippet (examples/proxies/nginx.conf) for tests: the snippet as a user
// copies it, only its loopback addresses pointed at the test's own.
package nginxtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The addresses the shipped snippet is written with.
const (
	snippetUpstream = "127.0.0.1:9000"
	snippetSluice   = "127.0.0.1:8080"
	snippetListen   = "127.0.0.1:8088"
)

// Start runs nginx with the snippet at snippetPath, its sluice address
// replaced by sluiceAddr and its upstream by upstreamAddr, listening on a
// free loopback port, and returns its base URL. nginx dies with the test.
// Without nginx the test skips, loudly; when CI is set it fails.
//
// edits are more replacements, old then new, such as a setting the snippet
// documents ("set $sluice_fail_open 0;", "set $sluice_fail_open 1;"); each
// must be found.
func Start(t testing.TB, snippetPath, sluiceAddr, upstreamAddr string, edits ...string) string {
	t.Helper()
	bin := lookup()
	if bin == "" {
		if CI() {
			t.Fatal("nginx is not installed, and CI is set: CI must install it (apt-get install nginx)")
		}
		t.Skip("SKIPPING: nginx is not installed; install it (apt-get install nginx) to test the shipped snippet")
	}
	snippet, err := os.ReadFile(snippetPath)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(edits); i += 2 {
		if !strings.Contains(string(snippet), edits[i]) {
			t.Fatalf("%s has no %q to change", snippetPath, edits[i])
		}
		snippet = []byte(strings.ReplaceAll(string(snippet), edits[i], edits[i+1]))
	}
	return serve(t, bin, func(listen string) string {
		return strings.NewReplacer(
			snippetUpstream, upstreamAddr,
			snippetSluice, sluiceAddr,
			snippetListen, listen,
		).Replace(string(snippet))
	})
}

// Upstream runs nginx as an upstream service that answers every request
// 200 "ok" (reading and dropping its body), closing a keep-alive
// connection after keepalive idle, as nginx's keepalive_timeout does; it
// returns its base URL. It skips or fails as Start does without nginx.
func Upstream(t testing.TB, keepalive time.Duration) string {
	t.Helper()
	bin := lookup()
	if bin == "" {
		if CI() {
			t.Fatal("nginx is not installed, and CI is set: CI must install it (apt-get install nginx)")
		}
		t.Skip("SKIPPING: nginx is not installed; install it (apt-get install nginx) to run it as an upstream")
	}
	return serve(t, bin, func(listen string) string {
		return fmt.Sprintf(`server {
    listen %s;
    keepalive_timeout %dms;
    keepalive_requests 100000;
    location / {
        client_max_body_size 1m;
        client_body_buffer_size 1m;
        return 200 "ok\n";
    }
}`, listen, keepalive.Milliseconds())
	})
}

// serve runs nginx with the server blocks conf writes for a listen
// address, on a free loopback port, until the test ends.
func serve(t testing.TB, bin string, conf func(listen string) string) string {
	dir := t.TempDir()
	for attempt := 0; ; attempt++ {
		port := freePort(t)
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
`, dir, conf(fmt.Sprintf("127.0.0.1:%d", port)))
		path := filepath.Join(dir, "nginx.conf")
		if err := os.WriteFile(path, []byte(full), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(bin, "-p", dir, "-c", path, "-e", filepath.Join(dir, "error.log"))
		// A process group of its own that dies with the test process, so
		// no nginx outlives a panicking or timed-out test.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); <-done })
		if up, retry := waitListening(t, port, done, dir, attempt); up {
			return fmt.Sprintf("http://127.0.0.1:%d", port)
		} else if !retry {
			t.Fatal("nginx did not start listening within 10s")
		}
	}
}

// waitListening waits for nginx to listen on port. It reports retry when
// nginx exited because the port was taken between pick and bind.
func waitListening(t testing.TB, port int, done chan error, dir string, attempt int) (up, retry bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		select {
		case err := <-done:
			done <- err
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			if attempt < 3 && strings.Contains(string(log), "Address already in use") {
				return false, true
			}
			t.Fatalf("nginx exited: %v\n%s", err, log)
		default:
		}
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			return true, false
		}
	}
	return false, false
}

func lookup() string {
	if bin, err := exec.LookPath("nginx"); err == nil {
		return bin
	}
	for _, p := range []string{"/usr/sbin/nginx", "/usr/local/sbin/nginx"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// CI reports whether the CI environment variable is set, in which case a
// missing real component fails a test instead of skipping it.
func CI() bool {
	switch strings.ToLower(os.Getenv("CI")) {
	case "1", "true", "yes":
		return true
	}
	return false
}
