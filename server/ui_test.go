package server

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/internal/testkit/browsertest"

	"github.com/chromedp/chromedp"
	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/store/memory"
)

// The live page, in a real headless Chromium: it loads with no console
// error or exception, lists the rules as loaded, and after limited traffic
// its counts and its most limited keys change. UPDATE_SCREENSHOT=1 writes
// docs/ui.png from the page as the test leaves it.
func TestLivePageInABrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	cfg, err := rules.Parse("rules.yaml", []byte(`
rules:
  - {id: per-user, key: [user], rate: 3, per: 1h, penalty: {after: 5, block: 15m}}
  - {id: per-ip, key: [ip], rate: 1000, per: 1m}
  - {id: trial, key: [user], rate: 1, per: 1h, mode: shadow}
`))
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	live := NewLive()
	e, err := engine.New(cfg, engine.Options{Store: memory.New(), Logger: quiet, OnReject: live.Rejected, OnLock: live.Locked})
	if err != nil {
		t.Fatal(err)
	}
	live.Attach(e)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go live.Run(ctx)
	srv, err := New(Options{Engine: e, Loopback: true, Logger: quiet, Live: live})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()

	br := browsertest.Start(t)
	bctx := br.Ctx
	if err := chromedp.Do(bctx, chromedp.Navigate(ts.URL+"/ui"), chromedp.WaitVisible(`#rules tbody tr[data-rule="trial"]`)); err != nil {
		t.Fatal(err)
	}
	ruleIDs, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#rules tbody tr")].map(r => r.dataset.rule)`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(ruleIDs, ",") != "per-user,per-ip,trial" {
		t.Fatalf("the page lists rules %q", ruleIDs)
	}

	// Limited traffic: user u7 far over per-user (3 an hour), until locked.
	for range 40 {
		resp, err := http.Post(ts.URL+"/v1/check", "application/json", strings.NewReader(`{"request":{"ip":"203.0.113.7"},"attributes":{"user":"u7"}}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	// The page polls every 2 s and the counters are sampled every second:
	// wait for the page, bounded.
	var limited, topRows, lockedRows int
	deadline := time.Now().Add(20 * time.Second)
	for limited == 0 || topRows == 0 || lockedRows == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the page did not change: limited %d, top keys %d, locked %d", limited, topRows, lockedRows)
		}
		time.Sleep(250 * time.Millisecond)
		state, err := chromedp.Run(bctx, chromedp.Evaluate[struct{ Limited, Top, Locked int }](`({
			limited: [...document.querySelectorAll('#rules tr[data-rule="per-user"] polyline[data-series="limited"]')].length &&
				Math.max(...document.querySelector('#rules tr[data-rule="per-user"] polyline[data-series="limited"]').getAttribute("points").split(" ").map(p => 40 - Number(p.split(",")[1]))) > 2 ? 1 : 0,
			top: document.querySelectorAll('#top tbody tr[data-rule="per-user"]').length,
			locked: [...document.querySelectorAll('#locked tbody tr')].filter(r => r.textContent.includes("per-user")).length,
		})`))
		if err != nil {
			t.Fatal(err)
		}
		limited, topRows, lockedRows = state.Limited, state.Top, state.Locked
	}
	// The shadow series only on the shadow rule; the limited one only on
	// enforced rules; each sparkline writes its scale.
	lines, err := chromedp.Run(bctx, chromedp.Evaluate[struct{ UserShadow, TrialShadow, TrialLimited, Scales int }](`({
		userShadow: document.querySelectorAll('#rules tr[data-rule="per-user"] polyline[data-series="shadowLimited"]').length,
		trialShadow: document.querySelectorAll('#rules tr[data-rule="trial"] polyline[data-series="shadowLimited"]').length,
		trialLimited: document.querySelectorAll('#rules tr[data-rule="trial"] polyline[data-series="limited"]').length,
		scales: [...document.querySelectorAll('#rules svg text.scale')].filter(t => /\/s$/.test(t.textContent)).length,
	})`))
	if err != nil {
		t.Fatal(err)
	}
	if lines.UserShadow != 0 || lines.TrialShadow != 1 || lines.TrialLimited != 0 || lines.Scales != 3 {
		t.Fatalf("sparklines: %+v; want the shadow line on the shadow rule only, and a scale on each of 3", lines)
	}
	topText, err := chromedp.Run(bctx, chromedp.Text(`#top tbody`))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(topText, "u7") {
		t.Fatalf("the page shows a key in the clear for a rule without showKeys: %q", topText)
	}
	if problems := br.Problems(); len(problems) > 0 {
		t.Fatalf("the page logged: %q", problems)
	}
	if os.Getenv("UPDATE_SCREENSHOT") != "" {
		png, err := chromedp.Run(bctx, chromedp.CaptureScreenshot())
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile("../docs/ui.png", png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// The live state gives the store's call time over its last calls: the
// median and the 99th percentile, from a bounded ring.
func TestLiveStateGivesTheStoresLatency(t *testing.T) {
	f := newFixture(t, Options{Loopback: true})
	live := NewLive()
	live.Attach(f.srv.e)
	f.srv.o.Live = live
	for i := range 2000 { // more than the ring: the first thousand leave it
		d := time.Millisecond
		if i >= 1000 && i%50 == 0 { // 2% of the last calls
			d = 40 * time.Millisecond
		}
		live.StoreCall(d, nil)
	}
	w := f.do("GET", "/v1/ui/state", "")
	var st LiveState
	if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || w.Code != 200 {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	if st.Store.Calls != 1024 || st.Store.P50Ms != 1 || st.Store.P99Ms != 40 {
		t.Fatalf("store %+v, want 1024 calls, p50 1 ms, p99 40 ms", st.Store)
	}
	if len(st.Rules) != 3 || st.TopLimited == nil || st.Locked == nil || st.Times == nil {
		t.Fatalf("state %+v", st)
	}
}

// The page follows the admin endpoints' rule: on loopback, or with a token
// (which its data then needs); refused beyond loopback without one.
func TestLivePageFollowsTheAdminRule(t *testing.T) {
	for _, tc := range []struct {
		o          Options
		page, data int
	}{
		{Options{Loopback: true}, 200, 200},
		{Options{Loopback: false}, 403, 403},
		{Options{Loopback: false, AdminToken: "t0k"}, 200, 401},
	} {
		f := newFixture(t, tc.o)
		if w := f.do("GET", "/ui", ""); w.Code != tc.page {
			t.Errorf("%+v: /ui %d, want %d", tc.o, w.Code, tc.page)
		}
		if w := f.do("GET", "/v1/ui/state", ""); w.Code != tc.data {
			t.Errorf("%+v: /v1/ui/state %d, want %d", tc.o, w.Code, tc.data)
		}
	}
	f := newFixture(t, Options{AdminToken: "t0k"})
	if w := f.do("GET", "/v1/ui/state", "", "Authorization", "Bearer t0k"); w.Code != 200 {
		t.Errorf("with the token: %d", w.Code)
	}
}

// Without the admin token the page says how to give it, not a raw 401.
func TestLivePageAsksForTheToken(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a browser")
	}
	cfg, _ := rules.Parse("rules.yaml", []byte("rules:\n  - {id: a, key: [ip], rate: 1, per: 1h}\n"))
	e, err := engine.New(cfg, engine.Options{Store: memory.New()})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Options{Engine: e, Loopback: false, AdminToken: "t0k", Live: NewLive()})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	br := browsertest.Start(t)
	var status string
	for end := time.Now().Add(20 * time.Second); !strings.Contains(status, "#token="); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the page says %q without the token", status)
		}
		if status == "" {
			if err := chromedp.Do(br.Ctx, chromedp.Navigate(ts.URL+"/ui")); err != nil {
				t.Fatal(err)
			}
		}
		if status, err = chromedp.Run(br.Ctx, chromedp.Text("#status")); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Contains(status, "{") {
		t.Fatalf("the page shows the raw answer: %q", status)
	}
}
