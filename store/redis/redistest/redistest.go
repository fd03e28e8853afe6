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

// Cluster is a running Redis Cluster of three masters.
type Cluster struct {
	Nodes []*Server
}

// StartCluster runs three redis-server processes in cluster mode on free
// loopback ports, joins them with redis-cli --cluster create (all 16384 slots
// over three masters), and waits until every node says the cluster is ok.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	Need(t)
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-cli is not on PATH, and CI=true")
		}
		t.Skip("SKIPPING: redis-cli is not on PATH; it forms the test cluster")
	}
	c := &Cluster{}
	args := []string{"--cluster", "create"}
	for range 3 {
		dir := t.TempDir()
		n := Start(t, "cluster-enabled yes", "cluster-config-file "+dir+"/nodes.conf", "cluster-node-timeout 5000")
		c.Nodes = append(c.Nodes, n)
		args = append(args, n.Addr)
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range c.Nodes {
		for !clusterOK(n) {
			if time.Now().After(deadline) {
				t.Fatalf("cluster node %s never reported cluster_state:ok", n.Addr)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// URL is the cluster's redis-cluster:// URL.
func (c *Cluster) URL() string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr
	}
	return "redis-cluster://" + strings.Join(addrs, ",")
}

func clusterOK(n *Server) bool {
	conn, err := net.DialTimeout("tcp", n.Addr, time.Second)
	if err != nil {
		return false
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(conn, "*2\r\n$7\r\nCLUSTER\r\n$4\r\nINFO\r\n")
	buf := make([]byte, 4096)
	k, _ := conn.Read(buf)
	return strings.Contains(string(buf[:k]), "cluster_state:ok")
}
