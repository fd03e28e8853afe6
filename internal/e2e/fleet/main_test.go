package fleet

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/proctest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	proctest.Remove()
	os.Exit(code)
}

// start runs the built sluice with args; its log is printed only if the
// test fails.
func start(t testing.TB, args ...string) (string, *exec.Cmd) {
	t.Helper()
	return proctest.Start(t, os.Stderr, args...)
}

// startTo is start with the process's stderr (its log) sent to stderr.
func startTo(t testing.TB, stderr io.Writer, args ...string) (string, *exec.Cmd) {
	t.Helper()
	return proctest.Start(t, stderr, args...)
}

// run runs the built sluice with args to its end (at most 30 s) and returns
// its exit code and what it wrote to stderr.
func run(t testing.TB, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, proctest.Sluice(t), args...)
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stderr.String()
	}
	t.Fatal(err)
	return 0, ""
}
