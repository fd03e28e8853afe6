// Package redistest starts real redis-server processes on free loopback
// ports for tests, and stops them.
//
// Without redis-server on PATH a test is skipped with a loud reason, unless
// CI=true: then a missing Redis fails the test, never skips it.
package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Server is a running redis-server.
type Server struct {
	Addr string
	cmd  *exec.Cmd
	t    testing.TB
}

// Need finds redis-server, skipping (or, in CI, failing) the test without it.
func Need(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is not on PATH, and CI=true: CI must install it (apt-get install redis-server)")
		}
		t.Skip("SKIPPING: redis-server is not on PATH; install it (apt-get install redis-server) to run the Redis tests")
	}
	return path
}

// Start runs a redis-server with extra config lines on a free loopback port
// and waits until it answers. It is stopped when the test ends.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin := Need(t)
	port := freePort(t)
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", t.TempDir(), "--protected-mode", "no"}
	for _, e := range extra {
		k, v, _ := strings.Cut(e, " ")
		args = append(args, "--"+k, v)
	}
	s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), cmd: exec.Command(bin, args...), t: t}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	deadline := time.Now().Add(10 * time.Second)
	for !s.ping() {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer within 10s", s.Addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return s
}

// URL is the server's redis:// URL.
func (s *Server) URL() string { return "redis://" + s.Addr }

// Stop ends the server.
func (s *Server) Stop() {
	if s.cmd.Process != nil {
		s.cmd.Process.Kill()
		s.cmd.Wait()
	}
}

// Do sends one command and returns the first line of the reply.
func (s *Server) Do(args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(conn, "$%d\r\n%s\r\n", len(a), a)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	return strings.TrimSpace(line), err
}

func (s *Server) ping() bool {
	r, err := s.Do("PING")
	return err == nil && r == "+PONG"
}

func freePort(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
