package failover

import (
	"os"
	"os/exec"
	"testing"

	"github.com/sluice-rl/sluice/internal/proctest"
)

func TestMain(m *testing.M) {
	release := proctest.Exclusive() // one end-to-end suite at a time
	code := m.Run()
	proctest.Remove()
	release()
	os.Exit(code)
}

// start runs the built sluice with args; its log is printed only if the
// test fails.
func start(t testing.TB, args ...string) (string, *exec.Cmd) {
	t.Helper()
	return proctest.Start(t, os.Stderr, args...)
}
