package main

import (
	"bufio"
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
