package main

import (
	"bufio"
	"os/exec"
	"syscall"

	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testkit/proctest"
)

// The built gateway, default settings, against request smuggling through an
// upgrade: 64 clients at once each open a connection, send a WebSocket
// upgrade to an upstream that does not speak WebSocket (it answers 200, as
// most do), and pipeline 10 POST /otp behind it on a rule of 3 per 10
// minutes. Every one of those requests is checked: exactly 3 reach the
// upstream, and an upstream that does accept the upgrade still gets a
// working tunnel on the same binary.
func TestGatewayUpgradeSmugglingEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	proctest.Exclusive(t)
	var otp atomic.Int64
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/otp" {
			otp.Add(1)
		}
		io.Copy(io.Discard, r.Body)
		w.Write([]byte("ok"))
	}))
	defer plain.Close()
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rulesPath, []byte("rules:\n  - {id: otp, match: {method: POST, path: /otp}, key: [ip], rate: 3, per: 10m}\n"), 0o600)
	base, _ := start(t, "gateway", "--config", rulesPath, "--upstream", plain.URL, "--listen", "127.0.0.1:0", "--admin-listen", "", "--watch", "0")
	addr := strings.TrimPrefix(base, "http://")

	var wg sync.WaitGroup
	var answered, refused atomic.Int64
	errs := make(chan error, 64)
	for c := range 64 {
		wg.Go(func() {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				errs <- err
				return
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(30 * time.Second))
			var b strings.Builder
			fmt.Fprintf(&b, "GET /chat HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: %s\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", []string{"websocket", "h2c", "WebSocket"}[c%3])
			for range 10 {
				b.WriteString("POST /otp HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 203.0.113.9\r\nContent-Length: 2\r\n\r\n{}")
			}
			conn.Write([]byte(b.String()))
			br := bufio.NewReader(conn)
			for i := range 11 {
				resp, err := http.ReadResponse(br, nil)
				if err != nil {
					errs <- fmt.Errorf("client %d, answer %d: %v", c, i+1, err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				answered.Add(1)
				if resp.StatusCode == 429 {
					refused.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if otp.Load() != 3 || refused.Load() != 64*10-3 || answered.Load() != 64*11 {
		t.Fatalf("upstream saw %d POST /otp (want 3); %d answers, %d refused (want %d, %d)", otp.Load(), answered.Load(), refused.Load(), 64*11, 64*10-3)
	}

	// The same binary still tunnels an upgrade its upstream accepts.
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
		if _, err := http.ReadRequest(br); err != nil {
			return
		}
		c.Write([]byte("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"))
		io.Copy(c, br)
	}()
	ws, _ := start(t, "gateway", "--config", rulesPath, "--upstream", "http://"+ln.Addr().String(), "--listen", "127.0.0.1:0", "--admin-listen", "", "--watch", "0")
	conn, err := net.Dial("tcp", strings.TrimPrefix(ws, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	conn.Write([]byte("GET /chat HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"))
	br := bufio.NewReader(conn)
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != 101 {
		t.Fatalf("an accepted upgrade: %v %v", resp, err)
	}
	conn.Write([]byte("ping"))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("tunnel: %q %v", buf, err)
	}
}

// The built gateway with an open-file limit of 512 and its default flags,
// against 700 connections opened at once and left idle: it does not run
// out of descriptors and exit (the previous build did, as fasthttp's
// server stops on EMFILE), and once they are gone it serves again.
func TestGatewaySurvivesAConnectionFloodEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }))
	defer up.Close()
	rulesPath := filepath.Join(t.TempDir(), "rules.yaml")
	os.WriteFile(rulesPath, []byte("rules:\n  - {id: all, key: [ip], rate: 1000000, per: 1s}\n"), 0o600)
	cmd := exec.Command("sh", "-c", `ulimit -n 512 && exec "$0" "$@"`, proctest.Sluice(t),
		"gateway", "--config", rulesPath, "--upstream", up.URL, "--listen", "127.0.0.1:0", "--admin-listen", "", "--watch", "0")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, _ := cmd.StdoutPipe()
	var log proctest.Output
	cmd.Stderr = &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("no banner: %v", err)
	}
	var base string
	for _, f := range strings.Fields(line) {
		if strings.HasPrefix(f, "http://127.0.0.1:") {
			base = f // the first: the gateway's, before its upstream's
			break
		}
	}
	var flood []net.Conn
	for range 700 {
		c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
		if err != nil {
			break
		}
		flood = append(flood, c)
	}
	select {
	case <-exited:
		t.Fatalf("the gateway exited under %d idle connections: %v\n%s", len(flood), waitErr, log.String())
	case <-time.After(2 * time.Second):
	}
	for _, c := range flood {
		c.Close()
	}
	client := &http.Client{Timeout: 5 * time.Second}
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := client.Get(base + "/after")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(end) {
			t.Fatalf("the gateway did not serve again within 30 s after the flood: %v\n%s", err, log.String())
		}
	}
	select {
	case <-exited:
		t.Fatalf("the gateway exited: %v", waitErr)
	default:
	}
}
