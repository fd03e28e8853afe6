// Package proctest runs the built sluice binary in tests, the way a user
// runs it: a fresh process with its own flags, on a loopback port it
// chooses, its address read from the first line it prints.
package proctest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Output collects a process's output, safe to read while it runs.
type Output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

var build struct {
	sync.Once
	bin string
	err error
	out []byte
}

// Sluice builds the sluice binary, once per test process, and returns its
// path. Main builds it before the tests run.
func Sluice(t testing.TB) string {
	t.Helper()
	if err := buildSluice(); err != nil {
		t.Fatal(err)
	}
	return build.bin
}

func buildSluice() error {
	build.Do(func() {
		build.bin, build.out, build.err = buildCommand("sluice", "github.com/sluice-rl/sluice/cmd/sluice")
	})
	if build.err != nil {
		return fmt.Errorf("build: %v\n%s", build.err, build.out)
	}
	return nil
}

// Main is the TestMain of a package whose tests start the built binary.
// It builds the binary before the tests run, so that the first test's
// time is its own, and removes it at the end. The build counts toward
// go test's timeout of the package all the same: cmd/go starts that clock
// (the -timeout, 10 minutes by default, and one minute more) when it starts
// the test binary, and on an empty build cache and a busy machine the build
// alone takes minutes.
func Main(m *testing.M) {
	flag.Parse()
	if !testing.Short() {
		if err := buildSluice(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	code := m.Run()
	Remove()
	os.Exit(code)
}

// buildCommand builds the command pkg into a temporary directory of its
// own with the release build's flags (.goreleaser.yaml): the binary a user
// runs. A test binary built with -race does not make it a race build.
//
// Builds take a machine-wide lock. `go test ./...` runs the packages that
// start sluice side by side, and on an empty build cache each compiled the
// whole program at the same time as the others (four minutes of CPU each,
// the largest part of a cold run); one at a time, the first compiles it
// into Go's build cache and the others only link.
func buildCommand(name, pkg string) (bin string, out []byte, err error) {
	dir, err := os.MkdirTemp("", "sluice-e2e")
	if err != nil {
		return "", nil, err
	}
	release := lock("sluice-e2e-build.lock")
	defer release()
	bin = filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-trimpath", "-o", bin, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err = cmd.CombinedOutput()
	return bin, out, err
}

// Remove deletes the binaries Sluice and the load generator built, if any.
func Remove() {
	for _, bin := range []string{build.bin, loadgen.bin} {
		if bin != "" {
			os.RemoveAll(filepath.Dir(bin))
		}
	}
}

// Start runs the sluice binary with args and returns the loopback address
// its first line names and the process, which is killed when the test ends
// (and with the test process, even on a panic or -timeout). Its stderr (the
// log) goes to stderr; given os.Stderr, it is kept instead (the last
// 256 KiB of it) and printed only if the test fails, so that a passing
// suite is quiet and a failing one shows the process's last words.
func Start(t testing.TB, stderr io.Writer, args ...string) (string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(Sluice(t), args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, _ := cmd.StdoutPipe()
	if stderr == os.Stderr {
		tail := &tailLog{max: 256 << 10}
		stderr = tail
		name := "sluice " + strings.Join(args, " ")
		t.Cleanup(func() { // runs after the kill below
			if t.Failed() {
				t.Logf("the log of %s (its last %d bytes):\n%s", name, tail.max, tail.String())
			}
		})
	}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("no banner from sluice: %v", err)
	}
	for _, f := range strings.Fields(line) { // sluice serving on http://127.0.0.1:PORT ...
		if strings.HasPrefix(f, "http://127.0.0.1:") || strings.HasPrefix(f, "https://127.0.0.1:") {
			return f, cmd
		}
	}
	t.Fatalf("banner %q", line)
	return "", nil
}

// tailLog keeps the last max bytes written to it.
type tailLog struct {
	mu  sync.Mutex
	b   []byte
	max int
}

func (l *tailLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	if over := len(l.b) - l.max; over > 0 {
		l.b = append(l.b[:0], l.b[over:]...)
	}
	return len(p), nil
}

func (l *tailLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}

// ReadMetric reads the metric name from the /metrics page of the process at
// base: the sum of its series, 0 if it has none yet (a labelled counter
// shows no series until its first count).
func ReadMetric(base, name string) (float64, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	var sum float64
	for _, line := range strings.Split(string(b), "\n") {
		series, v, ok := strings.Cut(line, " ")
		if ok && (series == name || strings.HasPrefix(series, name+"{")) {
			f, perr := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if perr != nil {
				return 0, fmt.Errorf("%s: %q: %v", name, line, perr)
			}
			sum += f
		}
	}
	return sum, err
}

// Lines returns the lines of s that contain sub, for a failure message that
// shows only what matters of a long log or page.
func Lines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Run runs the built sluice with args to its end and returns
// its exit code and what it wrote to stderr.
func Run(t testing.TB, args ...string) (int, string) {
	t.Helper()
	code, _, stderr := RunOutput(t, args...)
	return code, stderr
}

// RunOutput runs the built sluice with args to its end and returns its exit
// code, stdout and stderr.
func RunOutput(t testing.TB, args ...string) (int, string, string) {
	t.Helper()
	return RunFrom(t, "", args...)
}

// RunFrom runs the built sluice with args in the directory dir (the test's
// own if "") to its end and returns its exit code, stdout and stderr. A
// command that has not ended after two minutes is killed and fails the
// test: the longest (estimate, replay) end in seconds, even on a starved
// machine.
func RunFrom(t testing.TB, dir string, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, Sluice(t), args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("sluice %s: still running after two minutes", strings.Join(args, " "))
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stdout.String(), stderr.String()
	}
	t.Fatal(err)
	return 0, "", ""
}

// Exclusive waits until no other test on this machine holds the
// end-to-end lock, and holds it until t ends. The tests that take it start
// several sluice and redis-server processes and load them from 64 callers;
// `go test ./...` runs packages side by side, and two such tests at once
// on a 2-core machine starve their Redis past the store's deadline, which
// the tests rightly count as failures. It is taken per test, not per
// package: the wait is part of the waiting package's timeout, and one test
// of the other package is the longest it waits.
func Exclusive(t testing.TB) {
	t.Helper()
	if !testing.Short() {
		t.Cleanup(lock("sluice-e2e.lock"))
	}
}

// lock waits for the machine-wide lock of that name and takes it, and
// returns its release. Without a lock file to be had, it takes nothing.
func lock(name string) (release func()) {
	f, err := os.OpenFile(filepath.Join(os.TempDir(), name), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return func() {}
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return func() {}
	}
	return func() {
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}
}

// BusyLoops runs n shell loops that spin (`while :; do :; done`) until the
// test ends: a machine whose cores are taken, as a gateway's are in the
// traffic spike a limiter exists for.
func BusyLoops(t testing.TB, n int) {
	t.Helper()
	for range n {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
}
