// Package redistest starts real redis-server processes on free loopback
// ports for tests, and stops them.
//
// Without redis-server on PATH a test is skipped with a loud reason, unless
// CI=true: then a missing Redis fails the test, never skips it.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testkit/proctest"
)

// Server is a running redis-server.
type Server struct {
	Addr string
	cmd  *exec.Cmd
	bin  string
	args []string
	t    testing.TB
	// exited is closed once the process has ended and been reaped.
	exited chan struct{}
}

// CI reports whether the CI variable is set true ("1", "true" or "yes", in
// any case): then a missing server fails a test instead of skipping it.
func CI() bool {
	switch strings.ToLower(os.Getenv("CI")) {
	case "1", "true", "yes":
		return true
	}
	return false
}

// Need finds redis-server, skipping (or, in CI, failing) the test without it.
func Need(t testing.TB) string {
	t.Helper()
	path, err := exec.LookPath("redis-server")
	if err != nil {
		if CI() {
			t.Fatal("redis-server is not on PATH, and CI is set: CI must install it (apt-get install redis-server)")
		}
		t.Skip("SKIPPING: redis-server is not on PATH; install it (apt-get install redis-server) to run the Redis tests")
	}
	return path
}

// Start runs a redis-server with extra config lines on a free loopback port
// and waits until it answers. It is stopped when the test ends. A port taken
// by someone else between picking and binding it is retried with another.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	bin := Need(t)
	dir := t.TempDir()
	cluster := slices.Contains(extra, "cluster-enabled yes")
	var lastErr error
	for range 20 {
		port := freePort(t)
		if cluster && !portFree(port+10000) {
			continue // a cluster node also listens on its bus port, port + 10000
		}
		args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--protected-mode", "no"}
		for _, e := range extra {
			k, v, _ := strings.Cut(e, " ")
			args = append(args, "--"+k, v)
		}
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), bin: bin, args: args, t: t}
		if lastErr = s.start(); lastErr == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	if lastErr == nil {
		lastErr = errors.New("no free pair of ports for a cluster node and its bus")
	}
	t.Fatal(lastErr)
	return nil
}

func (s *Server) run() {
	s.t.Helper()
	if err := s.start(); err != nil {
		s.t.Fatal(err)
	}
}

// start runs the process and waits until it answers, or says why not.
func (s *Server) start() error {
	log := &proctest.Output{}
	s.cmd = exec.Command(s.bin, s.args...)
	s.cmd.Stdout, s.cmd.Stderr = log, log
	// The server dies with the test process, even on a panic or -timeout.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) { cmd.Wait(); close(exited) }(s.cmd, s.exited)
	deadline := time.Now().Add(10 * time.Second)
	for !s.ping() {
		select {
		case <-s.exited:
			return fmt.Errorf("redis-server on %s exited: %s", s.Addr, log.String())
		default:
		}
		if time.Now().After(deadline) {
			s.Stop()
			return fmt.Errorf("redis-server on %s did not answer within 10s", s.Addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

// Restart starts the stopped server again on the same port: empty (a
// restart or failover that lost the scripts, NOSCRIPT, and the counts), or
// with what its append-only file kept if it was started with "appendonly
// yes".
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.run()
}

// URL is the server's redis:// URL.
func (s *Server) URL() string { return "redis://" + s.Addr }

// Pause stops the server's process (SIGSTOP): a hung Redis that accepts
// connections but never answers. Resume continues it.
func (s *Server) Pause() { s.cmd.Process.Signal(syscall.SIGSTOP) }

// Resume continues a paused server (SIGCONT).
func (s *Server) Resume() { s.cmd.Process.Signal(syscall.SIGCONT) }

// Alive reports whether the server's process runs.
func (s *Server) Alive() bool {
	if s.cmd == nil || s.exited == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}

// Stop ends the server (SIGKILL: what it has not written to disk is lost;
// with appendonly yes, Restart reads back what it had).
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Process.Signal(syscall.SIGCONT) // a paused process dies only once continued
	<-s.exited
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

// portFree reports whether a loopback port can be listened on now.
func portFree(port int) bool {
	if port > 65535 {
		return false
	}
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	ln.Close()
	return true
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
	return startCluster(t, 0, 5000)
}

// StartClusterWithReplicas runs three masters and a replica of each
// (Nodes[0:3] the masters, Nodes[3:6] their replicas, in redis-cli's
// pairing), with cluster-node-timeout nodeTimeout milliseconds, and waits
// until the cluster is ok and every replica is in sync: a master killed
// then fails over to its replica.
func StartClusterWithReplicas(t testing.TB, nodeTimeout int) *Cluster {
	t.Helper()
	c := startCluster(t, 1, nodeTimeout)
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range c.Nodes[3:] {
		for !linkUp(n) {
			if time.Now().After(deadline) {
				t.Fatalf("replica %s never came in sync", n.Addr)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// Promoted reports whether one of the replicas (Nodes[3:]) has become a
// master: a failover happened.
func (c *Cluster) Promoted() bool {
	for _, n := range c.Nodes[min(3, len(c.Nodes)):] {
		if n.Alive() && isMaster(n) {
			return true
		}
	}
	return false
}

func isMaster(n *Server) bool { return strings.Contains(n.Info("replication"), "role:master") }

// Healthy reports whether every live node says cluster_state:ok.
func (c *Cluster) Healthy() bool {
	for _, n := range c.Nodes {
		if n.Alive() && !clusterOK(n) {
			return false
		}
	}
	return true
}

func startCluster(t testing.TB, replicas, nodeTimeout int) *Cluster {
	Need(t)
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		if CI() {
			t.Fatal("redis-cli is not on PATH, and CI is set")
		}
		t.Skip("SKIPPING: redis-cli is not on PATH; it forms the test cluster")
	}
	c := &Cluster{}
	args := []string{"--cluster", "create"}
	for range 3 * (1 + replicas) {
		dir := t.TempDir()
		n := Start(t, "cluster-enabled yes", "cluster-config-file "+dir+"/nodes.conf", "cluster-node-timeout "+strconv.Itoa(nodeTimeout))
		c.Nodes = append(c.Nodes, n)
		args = append(args, n.Addr)
	}
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
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

// Reshard moves slots hash slots from the master from to the master to
// with redis-cli --cluster reshard, a slot at a time (keys move with
// MIGRATE, clients see MOVED and ASK meanwhile). It returns when every
// slot has moved, or redis-cli's error.
func (c *Cluster) Reshard(from, to *Server, slots int) error {
	fromID, err := from.ClusterID()
	if err != nil {
		return err
	}
	toID, err := to.ClusterID()
	if err != nil {
		return err
	}
	out, err := exec.Command("redis-cli", "--cluster", "reshard", from.Addr,
		"--cluster-from", fromID, "--cluster-to", toID,
		"--cluster-slots", strconv.Itoa(slots), "--cluster-yes").CombinedOutput()
	if err != nil {
		return fmt.Errorf("redis-cli --cluster reshard: %v\n%s", err, out)
	}
	return nil
}

// ClusterID is a cluster node's ID (CLUSTER MYID).
func (n *Server) ClusterID() (string, error) {
	id := strings.TrimSpace(n.bulk("CLUSTER", "MYID"))
	if id == "" {
		return "", fmt.Errorf("CLUSTER MYID on %s: no answer", n.Addr)
	}
	return id, nil
}

// Redirections counts the MOVED, ASK and TRYAGAIN answers every live node
// has given since it started (INFO errorstats), by kind.
func (c *Cluster) Redirections() map[string]int {
	out := map[string]int{}
	for _, n := range c.Nodes {
		if !n.Alive() {
			continue
		}
		for _, line := range strings.Split(n.Info("errorstats"), "\n") {
			for _, kind := range []string{"MOVED", "ASK", "TRYAGAIN"} {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "errorstat_"+kind+":count="); ok {
					k, _ := strconv.Atoi(v)
					out[kind] += k
				}
			}
		}
	}
	return out
}

// Info is the text of one INFO section ("" on any error).
func (s *Server) Info(section string) string { return s.bulk("INFO", section) }

// bulk sends one command whose reply is a bulk string and returns it ("" on
// any error).
func (s *Server) bulk(args ...string) string {
	conn, err := net.DialTimeout("tcp", s.Addr, time.Second)
	if err != nil {
		return ""
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(conn, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(conn, "$%d\r\n%s\r\n", len(a), a)
	}
	r := bufio.NewReader(conn)
	head, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(head, "$") {
		return ""
	}
	n, _ := strconv.Atoi(strings.TrimSpace(head[1:]))
	buf := make([]byte, max(n, 0))
	if _, err := io.ReadFull(r, buf); err != nil {
		return ""
	}
	return string(buf)
}

// AddMaster starts one more cluster node, joins it to the cluster as an
// empty master and appends it to Nodes.
func (c *Cluster) AddMaster(t testing.TB) *Server {
	t.Helper()
	dir := t.TempDir()
	n := Start(t, "cluster-enabled yes", "cluster-config-file "+dir+"/nodes.conf", "cluster-node-timeout 5000")
	if out, err := exec.Command("redis-cli", "--cluster", "add-node", n.Addr, c.Nodes[0].Addr).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster add-node: %v\n%s", err, out)
	}
	c.Nodes = append(c.Nodes, n)
	id, err := n.ClusterID()
	if err != nil {
		t.Fatal(err)
	}
	// Every node must know the new one (gossip takes a moment) before
	// slots can be moved to it.
	deadline := time.Now().Add(30 * time.Second)
	for _, m := range c.Nodes {
		for !clusterOK(m) || !strings.Contains(m.bulk("CLUSTER", "NODES"), id) {
			if time.Now().After(deadline) {
				t.Fatalf("node %s never learned of the added node %s", m.Addr, n.Addr)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return n
}

// Rebalance spreads the slots evenly over every master, empty ones too,
// with redis-cli --cluster rebalance.
func (c *Cluster) Rebalance() error {
	out, err := exec.Command("redis-cli", "--cluster", "rebalance", c.Nodes[0].Addr,
		"--cluster-use-empty-masters").CombinedOutput()
	if err != nil {
		return fmt.Errorf("redis-cli --cluster rebalance: %v\n%s", err, out)
	}
	return nil
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
	return strings.Contains(n.bulk("CLUSTER", "INFO"), "cluster_state:ok")
}

// Proxy is a TCP proxy in front of a server that can add latency: a slow
// network or an overloaded Redis, for deadline tests.
type Proxy struct {
	Addr  string
	delay atomic.Int64
	cut   atomic.Bool
}

// NewProxy proxies a free loopback port to target until the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{Addr: ln.Addr().String()}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c, target)
		}
	}()
	return p
}

// SetDelay makes every chunk of data wait d before it is passed on.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// SetCut cuts the link (true) or mends it: while cut, data waits in the
// proxy as it would in a partitioned network's buffers, and flows on in
// order when the link is mended, unless a side has given up and closed.
func (p *Proxy) SetCut(cut bool) { p.cut.Store(cut) }

func (p *Proxy) serve(c net.Conn, target string) {
	defer c.Close()
	up, err := net.DialTimeout("tcp", target, time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				time.Sleep(time.Duration(p.delay.Load()))
				for p.cut.Load() {
					time.Sleep(5 * time.Millisecond)
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	<-done
}

// Sentinel is a primary, a replica and one Sentinel watching them (quorum
// 1, down after 1 s), for failover tests.
type Sentinel struct {
	Primary, Replica, Sentinel *Server
	Name                       string
}

// StartSentinel runs a primary, a replica of it and a Sentinel on free
// loopback ports.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	primary := Start(t)
	replica := Start(t, "replicaof 127.0.0.1 "+strings.TrimPrefix(primary.Addr, "127.0.0.1:"))
	bin := Need(t)
	port := freePort(t)
	dir := t.TempDir()
	conf := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor sluice 127.0.0.1 %s 1\n"+
		"sentinel down-after-milliseconds sluice 1000\nsentinel failover-timeout sluice 5000\n",
		port, dir, strings.TrimPrefix(primary.Addr, "127.0.0.1:"))
	path := dir + "/sentinel.conf"
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	sen := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), bin: bin, args: []string{path, "--sentinel"}, t: t}
	sen.run()
	t.Cleanup(sen.Stop)
	// Wait until the replica is in sync, so a failover has data to promote.
	deadline := time.Now().Add(20 * time.Second)
	for {
		if linkUp(replica) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the replica never came up")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return &Sentinel{Primary: primary, Replica: replica, Sentinel: sen, Name: "sluice"}
}

// URL is the redis-sentinel:// URL of the set.
func (s *Sentinel) URL() string { return "redis-sentinel://" + s.Name + "@" + s.Sentinel.Addr }

// PrimaryAddr asks the Sentinel which address is the primary now.
func (s *Sentinel) PrimaryAddr() string {
	conn, err := net.DialTimeout("tcp", s.Sentinel.Addr, time.Second)
	if err != nil {
		return ""
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(conn, "*3\r\n$8\r\nSENTINEL\r\n$23\r\nget-master-addr-by-name\r\n$%d\r\n%s\r\n", len(s.Name), s.Name)
	r := bufio.NewReader(conn)
	var parts []string
	for range 5 {
		line, err := r.ReadString('\n')
		if err != nil {
			break
		}
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "*") && !strings.HasPrefix(line, "$") {
			parts = append(parts, line)
		}
	}
	if len(parts) < 2 {
		return ""
	}
	return parts[0] + ":" + parts[1]
}

// linkUp reports whether a replica's link to its primary is up.
func linkUp(n *Server) bool {
	conn, err := net.DialTimeout("tcp", n.Addr, time.Second)
	if err != nil {
		return false
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(conn, "*2\r\n$4\r\nINFO\r\n$11\r\nreplication\r\n")
	buf := make([]byte, 4096)
	k, _ := conn.Read(buf)
	return strings.Contains(string(buf[:k]), "master_link_status:up")
}
