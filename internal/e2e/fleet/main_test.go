package fleet

import (
	"io"
	"os"
	"os/exec"
	"testing"

	"github.com/sluice-rl/sluice/internal/testkit/proctest"
)

func TestMain(m *testing.M) { proctest.Main(m) }

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
