package server

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-rl/sluice/engine"
	"github.com/sluice-rl/sluice/share"
)

// Live keeps what the live page (/ui) and its JSON (/v1/ui/state) show:
// every rule's decisions per second over the last liveSpan seconds (the
// engine's counters, sampled once a second), the keys most limited right
// now (a space-saving heavy-hitter summary of rejections: at most
// liveTopKeys keys, so a flood of distinct keys costs no memory), and the
// keys penalties locked lately (at most liveLocks). Wire it to the engine
// with engine.Options.OnReject = live.Rejected and OnLock = live.Locked,
// and run Run.
type Live struct {
	e          *engine.Engine
	hot        *share.HotKeys
	rejections atomic.Uint64 // for the sampling in Rejected

	mu      sync.Mutex
	samples []liveSample             // oldest first, at most liveSpan+1
	locks   []liveLock               // newest first, at most liveLocks
	calls   [liveCalls]time.Duration // the last store calls' durations, a ring
	ncalls  int                      // calls recorded, ever
}

const (
	liveEvery   = 8    // one rejection in liveEvery feeds the top keys
	liveCalls   = 1024 // store calls the latency figures are taken over
	liveSpan    = 300  // seconds of history
	liveTopKeys = 64
	liveLocks   = 32
)

type liveSample struct {
	t     int64 // Unix seconds
	stats map[string]engine.RuleStats
}

type liveLock struct {
	rule, key string
	until     time.Time
}

// NewLive returns the live view's state; set its engine with Attach once
// the engine exists (the engine needs the hooks first).
func NewLive() *Live {
	return &Live{hot: share.NewHotKeys(liveTopKeys, 10*time.Second)}
}

// Attach sets the engine whose counters the view samples.
func (l *Live) Attach(e *engine.Engine) { l.e = e }

// Rejected is engine.Options.OnReject. It counts one rejection in
// liveEvery, as liveEvery of them: the summary costs about a microsecond
// under its lock for a key it does not hold, and a flood of distinct
// rejected keys must not serialise the 429 path on it. A key with more than
// 1/64 of the rejections is still found, its rate estimated.
func (l *Live) Rejected(rule, key string) {
	if l.rejections.Add(1)%liveEvery == 0 {
		l.hot.ObserveN(rule, key, time.Now().UnixNano(), liveEvery)
	}
}

// Locked is engine.Options.OnLock.
func (l *Live) Locked(rule, key string, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.locks = append([]liveLock{{rule: rule, key: strings.Clone(key), until: time.Now().Add(d)}}, l.locks...)
	if len(l.locks) > liveLocks {
		l.locks = l.locks[:liveLocks]
	}
}

// StoreCall records a store call's duration, for the page's latency: chain
// it into storecall.Options.OnCall.
func (l *Live) StoreCall(d time.Duration, _ error) {
	l.mu.Lock()
	l.calls[l.ncalls%liveCalls] = d
	l.ncalls++
	l.mu.Unlock()
}

// latency returns the median and the 99th percentile of the last store
// calls, and how many they are.
func (l *Live) latency() (p50, p99 time.Duration, n int) {
	n = min(l.ncalls, liveCalls)
	if n == 0 {
		return 0, 0, 0
	}
	ds := slices.Clone(l.calls[:n])
	slices.Sort(ds)
	return ds[n/2], ds[min(n-1, n*99/100)], n
}

// Run samples the engine's counters once a second until ctx is done.
func (l *Live) Run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	l.sample(time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			l.sample(now)
		}
	}
}

func (l *Live) sample(now time.Time) {
	if l.e == nil {
		return
	}
	st := map[string]engine.RuleStats{}
	for _, s := range l.e.Stats() {
		st[s.Rule] = s
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.samples = append(l.samples, liveSample{t: now.Unix(), stats: st})
	if len(l.samples) > liveSpan+1 {
		l.samples = l.samples[len(l.samples)-liveSpan-1:]
	}
}

// LiveState is GET /v1/ui/state: what the live page shows, for any tool.
type LiveState struct {
	Now        int64                  `json:"now"` // Unix milliseconds
	Rules      []LiveRule             `json:"rules"`
	Times      []int64                `json:"times"` // Unix seconds of each point of the series
	Series     map[string]*LiveSeries `json:"series"`
	TopLimited []LiveKey              `json:"topLimited"`
	Locked     []LiveKey              `json:"locked"`
	Overrides  []LiveOverride         `json:"overrides"`
	Store      LiveStore              `json:"store"`
}

// LiveOverride is an operator's override in force (keyed as LiveKey: the
// key itself only for a rule with showKeys, else its hash).
type LiveOverride struct {
	LiveKey
	ID     string `json:"id"`
	Prefix string `json:"prefix,omitempty"`
	What   string `json:"what"`
	By     string `json:"by"`
	Reason string `json:"reason"`
}

// LiveRule is a rule as loaded.
type LiveRule struct {
	ID      string `json:"id"`
	Summary string `json:"summary"`
	Source  string `json:"source"` // file:line
	Shadow  bool   `json:"shadow"`
}

// LiveSeries are a rule's decisions per second, one value per point of
// Times: allowed, refused by it, and what it would refuse in shadow mode.
type LiveSeries struct {
	Allowed       []float64 `json:"allowed"`
	Limited       []float64 `json:"limited"`
	ShadowLimited []float64 `json:"shadowLimited"`
}

// LiveKey is a key the page lists: Key in the clear only for a rule with
// showKeys, KeyHash otherwise (the first 8 bytes of its SHA-256).
type LiveKey struct {
	Rule        string  `json:"rule"`
	Key         string  `json:"key,omitempty"`
	KeyHash     string  `json:"keyHash,omitempty"`
	PerSecond   float64 `json:"perSecond,omitempty"`   // topLimited: rejections per second
	LockedForMs int64   `json:"lockedForMs,omitempty"` // locked: time left
}

// LiveStore is the store's state.
type LiveStore struct {
	Breakers map[string]string `json:"breakers"` // per node ("" for one store): closed, half-open, open
	Gateways int               `json:"gateways"`
	Degraded float64           `json:"degradedPerSecond"` // decisions answered by fail modes, last second
	// The store's call time over its last calls (Calls of them, at most
	// 1024): the embedded store's calls are not timed (they never wait).
	P50Ms float64 `json:"p50Ms"`
	P99Ms float64 `json:"p99Ms"`
	Calls int     `json:"calls"`
}

func (s *Server) liveState(w http.ResponseWriter, r *http.Request) {
	l := s.o.Live
	cfg := s.e.Config()
	now := time.Now()
	out := LiveState{Now: now.UnixMilli(), Rules: []LiveRule{}, Times: []int64{}, Series: map[string]*LiveSeries{},
		TopLimited: []LiveKey{}, Locked: []LiveKey{}, Overrides: []LiveOverride{}, Store: LiveStore{Breakers: map[string]string{}, Gateways: s.e.Gateways()}}
	show := func(rule, key string) LiveKey {
		if r := cfg.Rule(rule); r != nil && r.ShowKeys {
			return LiveKey{Rule: rule, Key: key}
		}
		sum := sha256.Sum256([]byte(key))
		return LiveKey{Rule: rule, KeyHash: hex.EncodeToString(sum[:8])}
	}
	for _, r := range cfg.Rules {
		out.Rules = append(out.Rules, LiveRule{ID: r.ID, Summary: r.SummaryIn(s.o.Region), Source: cfg.File + ":" + strconv.Itoa(r.Line), Shadow: r.Shadow})
		out.Series[r.ID] = &LiveSeries{Allowed: []float64{}, Limited: []float64{}, ShadowLimited: []float64{}}
	}
	for n, st := range s.e.Store().BreakerStates() {
		out.Store.Breakers[n] = st
	}
	if s.o.Overrides != nil {
		for _, o := range s.o.Overrides.Current().Live(now) {
			lo := LiveOverride{ID: o.ID, Prefix: o.Prefix, What: describeOverride(o), By: o.By, Reason: o.Reason}
			if o.Prefix == "" {
				lo.LiveKey = show(o.Rule, o.Key)
			} else {
				lo.Rule = o.Rule
			}
			out.Overrides = append(out.Overrides, lo)
		}
	}
	if l != nil {
		l.mu.Lock()
		for i := 1; i < len(l.samples); i++ {
			a, b := &l.samples[i-1], &l.samples[i]
			dt := float64(max(b.t-a.t, 1))
			out.Times = append(out.Times, b.t)
			var degraded float64
			for id, ser := range out.Series {
				x, y := a.stats[id], b.stats[id]
				ser.Allowed = append(ser.Allowed, float64(y.Allowed-x.Allowed)/dt)
				ser.Limited = append(ser.Limited, float64(y.Limited-x.Limited+y.FailedClosed-x.FailedClosed)/dt)
				ser.ShadowLimited = append(ser.ShadowLimited, float64(y.ShadowLimited-x.ShadowLimited)/dt)
				degraded += float64(y.FailedOpen-x.FailedOpen+y.FailedClosed-x.FailedClosed) / dt
			}
			out.Store.Degraded = degraded
		}
		p50, p99, n := l.latency()
		out.Store.P50Ms, out.Store.P99Ms, out.Store.Calls = float64(p50)/1e6, float64(p99)/1e6, n
		for _, lk := range l.locks {
			if left := lk.until.Sub(now); left > 0 {
				k := show(lk.rule, lk.key)
				k.LockedForMs = left.Milliseconds()
				out.Locked = append(out.Locked, k)
			}
		}
		l.mu.Unlock()
		for _, h := range l.hot.Top(10, 0, now.UnixNano()) {
			k := show(h.Rule, h.Key)
			k.PerSecond = h.Rate
			out.TopLimited = append(out.TopLimited, k)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

//go:embed ui.html
var uiPage []byte

func (s *Server) livePage(w http.ResponseWriter, r *http.Request) {
	if s.o.AdminToken == "" && !s.o.Loopback {
		// The admin endpoints' rule: beyond loopback, only with a token
		// (the page then sends it for its data, from its #token= fragment).
		writeProblem(w, http.StatusForbidden, "Forbidden", "the live page needs an admin token when the listener is not loopback", "")
		return
	}
	if s.o.AdminToken == "" {
		if why := s.sameListener(r); why != "" {
			writeProblem(w, http.StatusForbidden, "Forbidden", why, "")
			return
		}
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	// The page is self-contained: its script and style are inline and it
	// fetches only its own JSON.
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:")
	w.Write(uiPage)
}
