package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-rl/sluice/internal/testkit/browsertest"

	"github.com/chromedp/chromedp"
	"github.com/sluice-rl/sluice/sim"
)

// What `sluice simulate --format svg` and `sluice replay --html` write
// renders in a real headless Chromium: every scenario's picture has a
// drawing of some size, and the replay report its chart and tables, with
// no exception or console error.
func TestPicturesRenderInABrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	dir := t.TempDir()
	var files []string
	for _, s := range sim.Scenarios() {
		code, out, errs := runCLI(t, "simulate", s.Name, "--format", "svg")
		if code != 0 {
			t.Fatalf("simulate %s --format svg: exit %d: %s", s.Name, code, errs)
		}
		p := filepath.Join(dir, s.Name+".svg")
		os.WriteFile(p, []byte(out), 0o600)
		files = append(files, p)
	}
	report := filepath.Join(dir, "replay.html")
	if code, _, errs := runCLI(t, "replay", "--config", "../../examples/shop.yaml", "../../examples/access.log", "--html", report); code != 0 {
		t.Fatalf("replay --html: exit %d: %s", code, errs)
	}

	br := browsertest.Start(t)
	bctx := br.Ctx
	for _, f := range files {
		if err := chromedp.Do(bctx, chromedp.Navigate("file://"+f)); err != nil {
			t.Fatal(err)
		}
		size, err := chromedp.Run(bctx, chromedp.Evaluate[struct {
			Root          string
			Width, Height float64
			Shapes        int
		}](`(() => {
			const s = document.documentElement, b = s.getBBox();
			return {root: s.tagName, width: b.width, height: b.height, shapes: document.querySelectorAll("polyline, rect[height]").length};
		})()`))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if size.Root != "svg" || size.Width < 100 || size.Height < 100 || size.Shapes < 3 {
			t.Errorf("%s renders as %+v", filepath.Base(f), size)
		}
	}
	if err := chromedp.Do(bctx, chromedp.Navigate("file://"+report), chromedp.WaitVisible("#rules")); err != nil {
		t.Fatal(err)
	}
	page, err := chromedp.Run(bctx, chromedp.Evaluate[struct{ Rules, Keys, Bars int }](`({
		rules: document.querySelectorAll("#rules tbody tr").length,
		keys: document.querySelectorAll("#keys tbody tr").length,
		bars: document.querySelectorAll("#chart svg rect[height]").length,
	})`))
	if err != nil {
		t.Fatal(err)
	}
	if page.Rules != 6 || page.Keys != 1 || page.Bars < 4 {
		t.Errorf("the replay report renders %+v, want 6 rules, 1 top key and the chart's bars", page)
	}
	if problems := br.Problems(); len(problems) > 0 {
		t.Errorf("the browser reported %q", problems)
	}
}
