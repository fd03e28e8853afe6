// Package browsertest starts a headless Chromium for tests (driven with
// github.com/chromedp/chromedp) and collects what a page reports wrong:
// uncaught exceptions and console errors or warnings.
package browsertest

import (
	"context"
	"fmt"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/sluice-rl/sluice/store/redis/redistest"
)

// Browser is a headless Chromium tab.
type Browser struct {
	Ctx      context.Context // for chromedp.Do and chromedp.Run
	mu       sync.Mutex
	problems []string
}

// Start starts a browser for the test, closed when it ends, with every
// action bounded by a minute. Without Chromium on PATH the test skips
// loudly, or fails in CI, which installs the chromium package.
func Start(t *testing.T) *Browser {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		if redistest.CI() {
			t.Fatal("no chromium: CI must install the chromium package")
		}
		t.Skip("SKIPPED LOUDLY: no chromium on PATH (apt-get install chromium)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1200, 900))
	actx, acancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(acancel)
	bctx, bcancel := chromedp.NewContext(actx)
	t.Cleanup(bcancel)
	bctx, tcancel := context.WithTimeout(bctx, time.Minute)
	t.Cleanup(tcancel)
	b := &Browser{Ctx: bctx}
	if err := chromedp.Listen(bctx, func(ev any) {
		b.mu.Lock()
		defer b.mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			b.problems = append(b.problems, "exception: "+ev.ExceptionDetails.Text)
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeWarning {
				b.problems = append(b.problems, fmt.Sprintf("console %s", ev.Type))
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	return b
}

// Problems returns what pages have reported wrong so far.
func (b *Browser) Problems() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.problems...)
}
